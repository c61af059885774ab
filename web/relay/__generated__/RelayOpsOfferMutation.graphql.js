/**
 * @generated SignedSource<<7e3e3a75073753b43e4e18a727cc46ee>>
 * @lightSyntaxTransform
 */

/* eslint-disable */

'use strict';

var node = (function(){
var v0 = [
  {
    "defaultValue": null,
    "kind": "LocalArgument",
    "name": "input"
  }
],
v1 = [
  {
    "alias": null,
    "args": [
      {
        "kind": "Variable",
        "name": "input",
        "variableName": "input"
      }
    ],
    "concreteType": "OfferPoolPayload",
    "kind": "LinkedField",
    "name": "offerPool",
    "plural": false,
    "selections": [
      {
        "alias": null,
        "args": null,
        "concreteType": "OfferedPool",
        "kind": "LinkedField",
        "name": "pool",
        "plural": false,
        "selections": [
          {
            "alias": null,
            "args": null,
            "kind": "ScalarField",
            "name": "id",
            "storageKey": null
          },
          {
            "alias": null,
            "args": null,
            "kind": "ScalarField",
            "name": "poolId",
            "storageKey": null
          },
          {
            "alias": null,
            "args": null,
            "kind": "ScalarField",
            "name": "viewerTenantId",
            "storageKey": null
          },
          {
            "alias": null,
            "args": null,
            "kind": "ScalarField",
            "name": "owned",
            "storageKey": null
          },
          {
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
          }
        ],
        "storageKey": null
      }
    ],
    "storageKey": null
  }
];
return {
  "fragment": {
    "argumentDefinitions": (v0/*:: as any*/),
    "kind": "Fragment",
    "metadata": null,
    "name": "RelayOpsOfferMutation",
    "selections": (v1/*:: as any*/),
    "type": "Mutation",
    "abstractKey": null
  },
  "kind": "Request",
  "operation": {
    "argumentDefinitions": (v0/*:: as any*/),
    "kind": "Operation",
    "name": "RelayOpsOfferMutation",
    "selections": (v1/*:: as any*/)
  },
  "params": {
    "cacheID": "5550f61ea50b5a0572a1309f05f9f6b4",
    "id": null,
    "metadata": {},
    "name": "RelayOpsOfferMutation",
    "operationKind": "mutation",
    "text": "mutation RelayOpsOfferMutation(\n  $input: OfferPoolInput!\n) {\n  offerPool(input: $input) {\n    pool {\n      id\n      poolId\n      viewerTenantId\n      owned\n      quotas {\n        resource\n        max\n        used\n      }\n    }\n  }\n}\n"
  }
};
})();

node.hash = "9405af588ea828a5f8162106c3435d5d";

module.exports = node;
