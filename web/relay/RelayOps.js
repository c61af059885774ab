// The operations web/clients.mjs runs through relay-runtime, compiled by relay-compiler
// (web/relay.config.json; `npx relay-compiler` in web/ rewrites relay/__generated__, and
// tests/graphql/test_client_caches.py checks with --validate that they are current).
// This file is only read by the compiler: `graphql` is its tag, never called.
/* global graphql */

graphql`
  fragment RelayOps_pool on Pool @refetchable(queryName: "RelayOpsPoolRefetchQuery") {
    id
    viewerTenantId
    owned
    quotas { resource max used }
  }
`;

graphql`
  query RelayOpsPoolQuery($tenantId: String!, $poolId: ID!) {
    pool(tenantId: $tenantId, poolId: $poolId) {
      id
      viewerTenantId
      owned
      quotas { resource max used }
      offers { id tenantId priority }
      ...RelayOps_pool
    }
  }
`;

graphql`
  mutation RelayOpsOfferMutation($input: OfferPoolInput!) {
    offerPool(input: $input) {
      pool { id poolId viewerTenantId owned quotas { resource max used } }
    }
  }
`;

graphql`
  query RelayOpsNodeQuery($id: ID!) {
    node(id: $id) {
      __typename
      id
      ... on Pool { owned viewerTenantId quotas { resource max } }
      ... on Offer { tenantId priority quotas { resource max } }
    }
  }
`;
