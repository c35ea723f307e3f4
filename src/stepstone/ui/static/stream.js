// The run page's event tail (issue 34): follows /run/stream with EventSource, which
// resumes after a dropped connection with Last-Event-ID. Text only (textContent): an
// event's data is never interpreted as HTML.
(function () {
  "use strict";
  function start() {
    var list = document.querySelector("ol.event-list[data-stream]");
    if (!list || !window.EventSource) { return; }
    var source = new EventSource(list.getAttribute("data-stream"));
    source.onmessage = function (message) {
      var event = JSON.parse(message.data);
      var item = document.createElement("li");
      item.className = "event" + (event.superseded ? " superseded" : "");
      item.setAttribute("data-id", event.id);
      var data = typeof event.data === "string" ? event.data : JSON.stringify(event.data);
      item.textContent = "[" + event.topic + "] step " + event.step + ": " + data;
      list.appendChild(item);
    };
    source.addEventListener("end", function () { source.close(); });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
