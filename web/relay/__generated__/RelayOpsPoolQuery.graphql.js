/**
 * @generated SignedSource<<3634df614e0beb0e8f9c2b634c96a8ce>>
 * @lightSyntaxTransform
 */

/* eslint-disable */

'use strict';

var node = (function(){
var v0 = {
  "defaultValue": null,
  "kind": "LocalArgument",
  "name": "poolId"
},
v1 = {
  "defaultValue": null,
  "kind": "LocalArgument",
  "name": "tenantId"
},
v2 = [
  {
    "kind": "Variable",
    "name": "poolId",
    "variableName": "poolId"
  },
  {
    "kind": "Variable",
    "name": "tenantId",
    "variableName": "tenantId"
  }
],
v3 = {
  "alias": null,
  "args": null,
  "kind": "ScalarField",
  "name": "id",
  "storageKey": null
},
v4 = {
  "alias": null,
  "args": null,
  "kind": "ScalarField",
  "name": "viewerTenantId",
  "storageKey": null
},
v5 = {
  "alias": null,
  "args": null,
  "kind": "ScalarField",
  "name": "owned",
  "storageKey": null
},
v6 = {
  "alias": null,
  "args": null,
  "concreteType": "Quota",
  "kind": "LinkedField",
  "name": "quotas",
  "plural": true,
  "selections": [
    {
      "alias": null,
      "args": null,
      "kind": "ScalarField",
      "name": "resource",
      "storageKey": null
    },
    {
      "alias": null,
      "args": null,
      "kind": "ScalarField",
      "name": "max",
      "storageKey": null
    },
    {
      "alias": null,
      "args": null,
      "kind": "ScalarField",
      "name": "used",
      "storageKey": null
    }
  ],
  "storageKey": null
},
v7 = {
  "alias": null,
  "args": null,
  "concreteType": "Offer",
  "kind": "LinkedField",
  "name": "offers",
  "plural": true,
  "selections": [
    (v3/*:: as any*/),
    {
      "alias": null,
      "args": null,
      "kind": "ScalarField",
      "name": "tenantId",
      "storageKey": null
    },
    {
      "alias": null,
      "args": null,
      "kind": "ScalarField",
      "name": "priority",
      "storageKey": null
    }
  ],
  "storageKey": null
};
return {
  "fragment": {
    "argumentDefinitions": [
      (v0/*:: as any*/),
      (v1/*:: as any*/)
    ],
    "kind": "Fragment",
    "metadata": null,
    "name": "RelayOpsPoolQuery",
    "selections": [
      {
        "alias": null,
        "args": (v2/*:: as any*/),
        "concreteType": "Pool",
        "kind": "LinkedField",
        "name": "pool",
        "plural": false,
        "selections": [
          (v3/*:: as any*/),
          (v4/*:: as any*/),
          (v5/*:: as any*/),
          (v6/*:: as any*/),
          (v7/*:: as any*/),
          {
            "args": null,
            "kind": "FragmentSpread",
            "name": "RelayOps_pool"
          }
        ],
        "storageKey": null
      }
    ],
    "type": "Query",
    "abstractKey": null
  },
  "kind": "Request",
  "operation": {
    "argumentDefinitions": [
      (v1/*:: as any*/),
      (v0/*:: as any*/)
    ],
    "kind": "Operation",
    "name": "RelayOpsPoolQuery",
    "selections": [
      {
        "alias": null,
        "args": (v2/*:: as any*/),
        "concreteType": "Pool",
        "kind": "LinkedField",
        "name": "pool",
        "plural": false,
        "selections": [
          (v3/*:: as any*/),
          (v4/*:: as any*/),
          (v5/*:: as any*/),
          (v6/*:: as any*/),
          (v7/*:: as any*/)
        ],
        "storageKey": null
      }
    ]
  },
  "params": {
    "cacheID": "d55bde51a44d45cf578ac5f85e86f472",
    "id": null,
    "metadata": {},
    "name": "RelayOpsPoolQuery",
    "operationKind": "query",
    "text": "query RelayOpsPoolQuery(\n  $tenantId: String!\n  $poolId: ID!\n) {\n  pool(tenantId: $tenantId, poolId: $poolId) {\n    id\n    viewerTenantId\n    owned\n    quotas {\n      resource\n      max\n      used\n    }\n    offers {\n      id\n      tenantId\n      priority\n    }\n    ...RelayOps_pool\n  }\n}\n\nfragment RelayOps_pool on Pool {\n  id\n  viewerTenantId\n  owned\n  quotas {\n    resource\n    max\n    used\n  }\n}\n"
  }
};
})();

node.hash = "dad5eeba361f44c3a8394a55d05025e7";

module.exports = node;
