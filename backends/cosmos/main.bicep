// stepstone on Azure Cosmos DB (NoSQL API): account, database, container, data-plane role.
//
// Deploy:
//   az deployment group create -g <rg> -f backends/cosmos/main.bicep \
//     -p accountName=<globally-unique-name> principalId=<managed-identity-principal-id>
//
// The container matches backends/cosmos/container.json (the definition CosmosStore
// creates with `stepstone init` / create=true); keep the two in step.

@description('Cosmos DB account name (3-44 lowercase letters, digits, hyphens; globally unique).')
param accountName string

@description('Region of the account.')
param location string = resourceGroup().location

@description('Database name (the DATABASE of cosmos://HOST/DATABASE/CONTAINER).')
param databaseName string = 'stepstone'

@description('Container name (the CONTAINER of cosmos://HOST/DATABASE/CONTAINER).')
param containerName string = 'runs'

@description('true: serverless (pay per request, good for bursty or small workloads); false: provisioned throughput.')
param serverless bool = true

@description('Provisioned only: autoscale maximum RU/s for the container (autoscale scales between 10% and 100%).')
@minValue(1000)
param autoscaleMaxThroughput int = 1000

@description('Object (principal) ID of the managed identity (or other Entra principal) the workers run as. Empty: no role assignment.')
param principalId string = ''

@description('Disable account keys so only Entra ID can reach the data plane (recommended in production).')
param disableLocalAuth bool = false

@description('Default consistency of the account. Session is the Cosmos default; checkpoints stay safe under any level (saves are ETag-conditional).')
@allowed([
  'Strong'
  'BoundedStaleness'
  'Session'
  'ConsistentPrefix'
  'Eventual'
])
param defaultConsistencyLevel string = 'Session'

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-05-15' = {
  name: accountName
  location: location
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    consistencyPolicy: {
      defaultConsistencyLevel: defaultConsistencyLevel
    }
    locations: [
      {
        locationName: location
        failoverPriority: 0
        isZoneRedundant: false
      }
    ]
    capabilities: serverless ? [
      {
        name: 'EnableServerless'
      }
    ] : []
    disableLocalAuth: disableLocalAuth
    minimalTlsVersion: 'Tls12'
  }
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-05-15' = {
  parent: account
  name: databaseName
  properties: {
    resource: {
      id: databaseName
    }
  }
}

resource container 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-05-15' = {
  parent: database
  name: containerName
  properties: {
    resource: {
      id: containerName
      // One logical partition per run: loads are point reads, saves touch one partition.
      partitionKey: {
        paths: [
          '/id'
        ]
        kind: 'Hash'
        version: 2
      }
      // States are never queried: index only what `stepstone runs`, prune and claims filter on.
      indexingPolicy: {
        indexingMode: 'consistent'
        automatic: true
        includedPaths: [
          {
            path: '/run_id/?'
          }
          {
            path: '/stepstone/?'
          }
          {
            path: '/step/?'
          }
          {
            path: '/total_steps/?'
          }
          {
            path: '/failure/?'
          }
          {
            path: '/created_at/?'
          }
          {
            path: '/updated_at/?'
          }
          {
            path: '/status/?'
          }
          {
            path: '/due_at/?'
          }
          {
            path: '/owner/?'
          }
          // A long run's state pieces (items of their own): found by run and generation.
          {
            path: '/piece_of/?'
          }
          {
            path: '/gen/?'
          }
        ]
        excludedPaths: [
          {
            path: '/state/*'
          }
          {
            path: '/*'
          }
        ]
        // Finding work (claimable): an equality on status, due_at ranged and ordered.
        compositeIndexes: [
          [
            {
              path: '/status'
              order: 'ascending'
            }
            {
              path: '/due_at'
              order: 'ascending'
            }
          ]
          // The dashboard's listing (list_page): newest first, with and without a status.
          [
            {
              path: '/status'
              order: 'ascending'
            }
            {
              path: '/updated_at'
              order: 'descending'
            }
            {
              path: '/run_id'
              order: 'descending'
            }
          ]
          [
            {
              path: '/updated_at'
              order: 'descending'
            }
            {
              path: '/run_id'
              order: 'descending'
            }
          ]
        ]
      }
      // TTL on, nothing expires unless an item carries `ttl` (expire() or ttl=).
      defaultTtl: -1
    }
    options: serverless ? {} : {
      autoscaleSettings: {
        maxThroughput: autoscaleMaxThroughput
      }
    }
  }
}

// Cosmos DB Built-in Data Contributor: read/write items, no control plane.
var dataContributorRoleId = '00000000-0000-0000-0000-000000000002'

resource dataContributor 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-05-15' = if (!empty(principalId)) {
  parent: account
  name: guid(account.id, container.id, principalId, dataContributorRoleId)
  properties: {
    roleDefinitionId: '${account.id}/sqlRoleDefinitions/${dataContributorRoleId}'
    principalId: principalId
    // Scoped to the one container: /dbs/<database>/colls/<container>.
    scope: '${account.id}/dbs/${databaseName}/colls/${containerName}'
  }
}

output endpoint string = account.properties.documentEndpoint
output configString string = 'cosmos://${replace(replace(account.properties.documentEndpoint, 'https://', ''), ':443/', '')}/${databaseName}/${containerName}'
