#!/usr/bin/env node
// TEST-ONLY local Azure Cosmos DB emulator for stepstone's test suite.
//
// Starts @vercel/cosmosdb-server (pinned at 1.0.1 in package.json) bound to
// 127.0.0.1 only. The server keeps everything in memory and checks no
// authorization header, so any master key is accepted (the helper uses the
// well-known emulator key).
//
// Environment:
//   COSMOS_HOST      address to bind               (default 127.0.0.1)
//   COSMOS_PORT      port to bind                  (default 8081)
//   COSMOS_PROTOCOL  "https" (default) or "http"
//   COSMOS_CERT      PEM certificate for https     (default: see below)
//   COSMOS_KEY       PEM private key for https     (default: see below)
//
// Certificate lookup for https: COSMOS_CERT/COSMOS_KEY if set, else
// ./certs/cert.pem + ./certs/key.pem next to this file (build-image.sh puts a
// freshly generated one there inside the image), else a self-signed cert for
// localhost/127.0.0.1 is generated with `openssl` into
// $TMPDIR/stepstone-cosmos-emulator-cert/ (and reused afterwards). The cert
// the npm package ships (cert.pem at its root) is expired and has no
// subjectAltName, so it is never used.
//
// On start it prints "TLS certificate: /abs/path/cert.pem" (https only; a
// client can trust that file) and then
// "Ready to accept HTTP(S) connections at host:port".
"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");
const { execFileSync } = require("child_process");

// ---------------------------------------------------------------------------
// Fix for an upstream bug (the ONLY behaviour change made here).
//
// Upstream source: vercel/cosmosdb-server, src/handler/read-document.ts, its
// default export (compiled: lib/handler/read-document.js). When the
// collection has a partition key it does
//     const data = collection.document(docId, parsedPartitionKey).read();
//     for (...) { if (data[path] !== clientKeys[i]) ... }
// without checking `data`, so a point read of a MISSING document throws
// "TypeError: Cannot read properties of undefined" and lib/index.js answers
// 500 instead of 404 NotFound.
//
// lib/routes.js copies `read_document_1.default` into its route table when it
// is first required, so the handler module's `default` export must be
// replaced BEFORE the package's entry point (lib/index.js -> lib/routes.js)
// is required. The wrapper only answers a 404 when the document really is
// absent; everything else goes to the original handler untouched.
// ---------------------------------------------------------------------------
const readDocumentModule = require("@vercel/cosmosdb-server/lib/handler/read-document");
const partitionHeader = require("@vercel/cosmosdb-server/lib/utils/get-partition-from-header");

const originalReadDocument = readDocumentModule.default;
if (typeof originalReadDocument !== "function") {
  throw new Error("@vercel/cosmosdb-server layout changed: read-document handler not found");
}

function notFound(res) {
  res.statusCode = 404;
  return {
    code: "NotFound",
    message: "Entity with the specified id does not exist in the system.,"
  };
}

readDocumentModule.default = function readDocumentFixed(account, req, res, params) {
  const { dbId, collId, docId } = params;
  const collection = account.database(dbId).collection(collId);
  if (collection.read()) {
    const header = partitionHeader.default(req);
    let partition;
    try {
      partition = partitionHeader.parsePartitionKey(header, docId);
    } catch (err) {
      partition = undefined; // let the original handler report its own error
    }
    if (partition !== undefined && !collection.document(docId, partition).read()) {
      return notFound(res);
    }
  }
  return originalReadDocument(account, req, res, params);
};

// Only now load the server (this builds the route table with the fix above).
const { createHttpServer, createHttpsServer } = require("@vercel/cosmosdb-server");

function generateCert(dir) {
  const cert = path.join(dir, "cert.pem");
  const key = path.join(dir, "key.pem");
  if (fs.existsSync(cert) && fs.existsSync(key)) return { cert, key };
  fs.mkdirSync(dir, { recursive: true });
  const tmpKey = `${key}.${process.pid}.tmp`;
  const tmpCert = `${cert}.${process.pid}.tmp`;
  execFileSync(
    "openssl",
    [
      "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3650",
      "-subj", "/CN=localhost",
      "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
      "-keyout", tmpKey, "-out", tmpCert
    ],
    { stdio: ["ignore", "ignore", "pipe"] }
  );
  // Rename so concurrent launchers never see a half-written pair.
  fs.renameSync(tmpKey, key);
  fs.renameSync(tmpCert, cert);
  return { cert, key };
}

function findCert() {
  if (process.env.COSMOS_CERT || process.env.COSMOS_KEY) {
    if (!process.env.COSMOS_CERT || !process.env.COSMOS_KEY) {
      throw new Error("set both COSMOS_CERT and COSMOS_KEY, or neither");
    }
    return { cert: process.env.COSMOS_CERT, key: process.env.COSMOS_KEY };
  }
  const local = path.join(__dirname, "certs");
  if (fs.existsSync(path.join(local, "cert.pem")) && fs.existsSync(path.join(local, "key.pem"))) {
    return { cert: path.join(local, "cert.pem"), key: path.join(local, "key.pem") };
  }
  return generateCert(path.join(os.tmpdir(), "stepstone-cosmos-emulator-cert"));
}

function main() {
  const host = process.env.COSMOS_HOST || "127.0.0.1";
  const port = parseInt(process.env.COSMOS_PORT || "8081", 10);
  const protocol = (process.env.COSMOS_PROTOCOL || "https").toLowerCase();
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`invalid COSMOS_PORT: ${process.env.COSMOS_PORT}`);
  }

  let server;
  if (protocol === "http") {
    server = createHttpServer({ keepAlive: true });
  } else if (protocol === "https") {
    const { cert, key } = findCert();
    // eslint-disable-next-line no-console
    console.log(`TLS certificate: ${path.resolve(cert)}`);
    // keepAlive: by default cosmosdb-server answers every request with "connection: close"
    // (lib/index.js, generateRequestHandler), so each request pays a new TCP and TLS
    // handshake (~25 ms of client CPU in the Python SDK). The real service keeps
    // connections alive; so do we, which makes the emulator's costs look like Azure's.
    server = createHttpsServer({
      cert: fs.readFileSync(cert),
      key: fs.readFileSync(key),
      keepAlive: true,
    });
  } else {
    throw new Error(`COSMOS_PROTOCOL must be "http" or "https", not ${protocol}`);
  }

  server.on("error", err => {
    // eslint-disable-next-line no-console
    console.error(`cosmos emulator: ${err.message}`);
    process.exit(1);
  });
  server.listen(port, host, () => {
    const addr = server.address();
    // eslint-disable-next-line no-console
    console.log(
      `Ready to accept ${protocol.toUpperCase()} connections at ${addr.address}:${addr.port}`
    );
  });

  const stop = () => {
    server.close(() => process.exit(0));
    server.closeAllConnections(); // kept-alive sockets would hold close() open
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  // In a FROM-scratch container node is PID 1; if close() hangs on open
  // keep-alive sockets, do not wait for docker's SIGKILL timeout.
  const hardStop = () => setTimeout(() => process.exit(0), 1000).unref();
  process.on("SIGTERM", hardStop);
  process.on("SIGINT", hardStop);
}

main();
