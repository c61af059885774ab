// Normalized client caches against a running service (CONTRACT section 10, "Client caches
// and Relay"; docs/graphql.md "Client caches"): @apollo/client's InMemoryCache, urql's
// Graphcache and relay-runtime's store, as the libraries ship them.
//
//   node clients.mjs <graphql url> <config json>
//
// config: {owner, admin, poolId, pools, guest}: the owner's token (acting for the owner
// tenant `acme`), a fleet admin's token, the pool offered here, the owner's pool ids
// (creation order), the tenant the pool is offered to. Prints one JSON line per check,
// {"check", "ok", "detail"}, then {"summary": {...}}; exits 0 when it could run them all.

import { createRequire } from 'node:module';

import { ApolloClient, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { relayStylePagination } from '@apollo/client/utilities';
import { Client, fetchExchange, gql as urqlGql } from '@urql/core';
import { cacheExchange } from '@urql/exchange-graphcache';
import relay from 'relay-runtime';

const require = createRequire(import.meta.url);
const relayOps = {
  pool: require('./relay/__generated__/RelayOpsPoolQuery.graphql.js'),
  offer: require('./relay/__generated__/RelayOpsOfferMutation.graphql.js'),
  node: require('./relay/__generated__/RelayOpsNodeQuery.graphql.js'),
  refetch: require('./relay/__generated__/RelayOpsPoolRefetchQuery.graphql.js'),
  fragment: require('./relay/__generated__/RelayOps_pool.graphql.js'),
};

const [url, configText] = process.argv.slice(2);
const config = JSON.parse(configText);
const OWNER = 'acme';
const GUEST = config.guest;
const BIG = 2147483647; // the owner's default quota max

const results = [];
function check(name, ok, detail) {
  results.push({ check: name, ok: Boolean(ok), detail });
  console.log(JSON.stringify({ check: name, ok: Boolean(ok), detail }));
}

const headers = (token) => ({ authorization: `Bearer ${token}` });
const gpuMax = (pool) => pool?.quotas?.find((q) => q.resource === 'gpu')?.max;

// The same documents for Apollo and urql; Relay runs relay-compiler's artifacts.
const POOL = `query ClientPool($tenantId: String!, $poolId: ID!) {
  pool(tenantId: $tenantId, poolId: $poolId) { id owned quotas { resource max used } }
}`;
// With the multi-tenant setting every Pool selection carries viewerTenantId.
const POOL_VIEWER = `query ClientPoolViewer($tenantId: String!, $poolId: ID!) {
  pool(tenantId: $tenantId, poolId: $poolId) { id viewerTenantId owned quotas { resource max used } }
}`;
// What existing scripts send: `pool { id … }` as before (id is now the view's own id;
// `poolId` the REST id, which Relay's mutation below reads).
const OFFER = `mutation ClientOffer($input: OfferPoolInput!) {
  offerPool(input: $input) { pool { id owned quotas { resource max used } } }
}`;
const NODE = `query ClientNode($id: ID!) {
  node(id: $id) { __typename id
    ... on Pool { owned quotas { resource max } }
    ... on Offer { tenantId priority } }
}`;
const OFFERS = `query ClientOffers($tenantId: String!, $poolId: ID!) {
  pool(tenantId: $tenantId, poolId: $poolId) { id offers { id tenantId priority } }
}`;
const PAGE = `query ClientPage($tenantId: String!, $first: Int, $after: String) {
  pools(tenantId: $tenantId, first: $first, after: $after) {
    edges { cursor node { id owned } }
    pageInfo { hasNextPage endCursor }
  }
}`;

const offerInput = (quota) => ({
  input: { tenantId: OWNER, poolId: config.poolId, toTenantId: GUEST, quota: [{ resource: 'gpu', max: quota }] },
});

// The multi-tenant setting of each client (docs/graphql.md shows these lines).
const APOLLO_MULTI_TENANT = { typePolicies: { Pool: { keyFields: ['id', 'viewerTenantId'] } } };
const URQL_MULTI_TENANT = { keys: { Pool: (pool) => `${pool.id}@${pool.viewerTenantId}` } };
const RELAY_MULTI_TENANT = (value, typeName) =>
  typeName === 'Pool' ? `${value.id}@${value.viewerTenantId}` : value.id;

// --- Apollo -----------------------------------------------------------------------------

function apollo(token, cacheOptions) {
  return new ApolloClient({
    link: new HttpLink({ uri: url, headers: headers(token) }),
    cache: new InMemoryCache(cacheOptions),
  });
}

async function apolloChecks() {
  // Default settings: the owner reads its pool, offers it, reads again from the cache.
  const client = apollo(config.owner);
  const vars = { tenantId: OWNER, poolId: config.poolId };
  const first = await client.query({ query: gql(POOL), variables: vars });
  const offered = await client.mutate({ mutation: gql(OFFER), variables: offerInput(3) });
  const again = client.readQuery({ query: gql(POOL), variables: vars });
  check('apollo: offerPool answers the offered view', offered.data.offerPool.pool.owned === false
    && gpuMax(offered.data.offerPool.pool) === 3,
    offered.data.offerPool.pool);
  check('apollo default: owner cached view kept after offerPool',
    first.data.pool.owned === true && again?.pool?.owned === true && gpuMax(again?.pool) === BIG,
    { before: first.data.pool, after: again?.pool });

  // A fleet admin acting for two tenants, with the one setting.
  const fleet = apollo(config.admin, APOLLO_MULTI_TENANT);
  const q = gql(POOL_VIEWER);
  await fleet.query({ query: q, variables: { tenantId: OWNER, poolId: config.poolId } });
  await fleet.query({ query: q, variables: { tenantId: GUEST, poolId: config.poolId } });
  const owner = fleet.readQuery({ query: q, variables: { tenantId: OWNER, poolId: config.poolId } });
  const guest = fleet.readQuery({ query: q, variables: { tenantId: GUEST, poolId: config.poolId } });
  check('apollo keyFields [id, viewerTenantId]: two tenants, two views',
    owner.pool.owned === true && gpuMax(owner.pool) === BIG && guest.pool.owned === false
    && gpuMax(guest.pool) === 3, { owner: owner.pool, guest: guest.pool });

  // Without it, the same client would read the last tenant's view for both (why it exists).
  const mixed = apollo(config.admin);
  await mixed.query({ query: q, variables: { tenantId: OWNER, poolId: config.poolId } });
  await mixed.query({ query: q, variables: { tenantId: GUEST, poolId: config.poolId } });
  const mixedOwner = mixed.readQuery({ query: q, variables: { tenantId: OWNER, poolId: config.poolId } });
  check('apollo default, acting for two tenants: views mix (the setting is needed)',
    mixedOwner.pool.owned === false, mixedOwner.pool);

  // node(id:): a pool and an offer, as the caller's own tenant sees them.
  const offers = await client.query({ query: gql(OFFERS), variables: vars, fetchPolicy: 'network-only' });
  const offerId = offers.data.pool.offers.find((o) => o.tenantId === GUEST)?.id;
  const poolNode = await client.query({ query: gql(NODE), variables: { id: config.poolId } });
  const offerNode = await client.query({ query: gql(NODE), variables: { id: offerId } });
  check('apollo: node(id:) refetches a pool', poolNode.data.node?.__typename === 'Pool'
    && poolNode.data.node.id === config.poolId && poolNode.data.node.owned === true, poolNode.data.node);
  check('apollo: node(id:) refetches an offer', offerNode.data.node?.__typename === 'Offer'
    && offerNode.data.node.id === offerId && offerNode.data.node.tenantId === GUEST, offerNode.data.node);
  const adminNode = await fleet.query({ query: gql(NODE), variables: { id: config.poolId } });
  check('apollo: a fleet admin\'s node(id:) is null (its own tenant is fleet)',
    adminNode.data.node === null && !adminNode.errors, adminNode.data);

  // relayStylePagination over 5 pools, 2 at a time: all 5 kept.
  const pager = apollo(config.owner, {
    typePolicies: { Query: { fields: { pools: relayStylePagination(['tenantId']) } } },
  });
  const page = gql(PAGE);
  const watched = pager.watchQuery({ query: page, variables: { tenantId: OWNER, first: 2 } });
  const subscription = watched.subscribe(() => {});
  let result = await watched.refetch();
  for (let i = 0; i < 10 && result.data.pools.pageInfo.hasNextPage; i += 1) {
    await watched.fetchMore({ variables: { after: result.data.pools.pageInfo.endCursor } });
    result = { data: pager.readQuery({ query: page, variables: { tenantId: OWNER, first: 2 } }) };
  }
  subscription.unsubscribe();
  const ids = result.data.pools.edges.map((e) => e.node.id);
  check('apollo relayStylePagination: 5 pools in pages of 2, all kept',
    JSON.stringify(ids) === JSON.stringify(config.pools), ids);
}

// --- urql Graphcache --------------------------------------------------------------------

function urql(token, cacheOptions) {
  return new Client({
    url,
    exchanges: [cacheExchange(cacheOptions ?? {}), fetchExchange],
    fetchOptions: { headers: headers(token) },
    requestPolicy: 'cache-first',
  });
}

async function urqlChecks() {
  const client = urql(config.owner);
  const vars = { tenantId: OWNER, poolId: config.poolId };
  const first = await client.query(urqlGql(POOL), vars).toPromise();
  const offered = await client.mutation(urqlGql(OFFER), offerInput(3)).toPromise();
  const again = await client.query(urqlGql(POOL), vars, { requestPolicy: 'cache-only' }).toPromise();
  check('urql: offerPool answers the offered view', offered.data?.offerPool.pool.owned === false,
    offered.data ?? offered.error?.message);
  check('urql graphcache default: owner cached view kept after offerPool',
    first.data.pool.owned === true && again.data?.pool?.owned === true && gpuMax(again.data?.pool) === BIG,
    { before: first.data.pool, after: again.data?.pool });

  const fleet = urql(config.admin, URQL_MULTI_TENANT);
  const q = urqlGql(POOL_VIEWER);
  await fleet.query(q, { tenantId: OWNER, poolId: config.poolId }).toPromise();
  await fleet.query(q, { tenantId: GUEST, poolId: config.poolId }).toPromise();
  const owner = await fleet.query(q, { tenantId: OWNER, poolId: config.poolId }, { requestPolicy: 'cache-only' }).toPromise();
  const guest = await fleet.query(q, { tenantId: GUEST, poolId: config.poolId }, { requestPolicy: 'cache-only' }).toPromise();
  check('urql keys Pool: id@viewerTenantId: two tenants, two views',
    owner.data?.pool.owned === true && gpuMax(owner.data?.pool) === BIG && guest.data?.pool.owned === false
    && gpuMax(guest.data?.pool) === 3, { owner: owner.data?.pool, guest: guest.data?.pool });

  const poolNode = await client.query(urqlGql(NODE), { id: config.poolId }).toPromise();
  check('urql: node(id:) refetches a pool', poolNode.data?.node?.__typename === 'Pool'
    && poolNode.data.node.owned === true, poolNode.data ?? poolNode.error?.message);
}

// --- Relay ------------------------------------------------------------------------------

function relayEnvironment(token, getDataID) {
  const network = relay.Network.create(async (params, variables) => {
    const response = await fetch(url, {
      method: 'POST',
      headers: { ...headers(token), 'content-type': 'application/json' },
      body: JSON.stringify({ query: params.text, variables }),
    });
    return response.json();
  });
  const options = { network, store: new relay.Store(new relay.RecordSource()) };
  if (getDataID) options.getDataID = getDataID;
  return new relay.Environment(options);
}

function relayRead(environment, request, variables) {
  const operation = relay.createOperationDescriptor(request, variables);
  return environment.lookup(operation.fragment).data;
}

function relayCommit(environment, mutation, variables) {
  return new Promise((resolve, reject) => {
    relay.commitMutation(environment, {
      mutation, variables, onCompleted: (data, errors) => (errors ? reject(errors) : resolve(data)),
      onError: reject,
    });
  });
}

async function relayChecks() {
  const environment = relayEnvironment(config.owner);
  const vars = { tenantId: OWNER, poolId: config.poolId };
  const first = await relay.fetchQuery(environment, relayOps.pool, vars).toPromise();
  const offered = await relayCommit(environment, relayOps.offer, offerInput(3));
  const again = relayRead(environment, relayOps.pool, vars);
  check('relay: offerPool answers the offered view', offered.offerPool.pool.owned === false
    && offered.offerPool.pool.poolId === config.poolId, offered.offerPool.pool);
  check('relay store default: owner cached view kept after offerPool',
    first.pool.owned === true && again?.pool?.owned === true && gpuMax(again?.pool) === BIG,
    { before: first.pool, after: again?.pool });

  // @refetchable on Pool: the compiler's refetch query goes through node(id:).
  const refetched = await relay.fetchQuery(environment, relayOps.refetch, { id: config.poolId }).toPromise();
  const node = await relay.fetchQuery(environment, relayOps.node, { id: config.poolId }).toPromise();
  // The query's data masks the fragment: read it from the store through its reference.
  const refetchedPool = refetched.node
    ? environment.lookup(relay.getSingularSelector(relayOps.fragment, refetched.node)).data
    : null;
  check('relay: @refetchable Pool refetch query answers the pool', refetchedPool?.id === config.poolId
    && refetchedPool.owned === true && refetchedPool.viewerTenantId === OWNER, refetchedPool);
  check('relay: node(id:) refetches a pool', node.node?.__typename === 'Pool' && node.node.owned === true,
    node.node);
  const freshOffers = await relay.fetchQuery(environment, relayOps.pool, vars, { fetchPolicy: 'network-only' }).toPromise();
  const guestOffer = freshOffers.pool.offers.find((o) => o.tenantId === GUEST);
  const offerNode = await relay.fetchQuery(environment, relayOps.node, { id: guestOffer?.id }).toPromise();
  check('relay: node(id:) refetches an offer', offerNode.node?.__typename === 'Offer'
    && offerNode.node.tenantId === GUEST && offerNode.node.priority === guestOffer?.priority, offerNode.node);

  const fleet = relayEnvironment(config.admin, RELAY_MULTI_TENANT);
  await relay.fetchQuery(fleet, relayOps.pool, { tenantId: OWNER, poolId: config.poolId }).toPromise();
  await relay.fetchQuery(fleet, relayOps.pool, { tenantId: GUEST, poolId: config.poolId }).toPromise();
  const owner = relayRead(fleet, relayOps.pool, { tenantId: OWNER, poolId: config.poolId });
  const guest = relayRead(fleet, relayOps.pool, { tenantId: GUEST, poolId: config.poolId });
  check('relay getDataID id@viewerTenantId: two tenants, two views',
    owner?.pool?.owned === true && gpuMax(owner?.pool) === BIG && guest?.pool?.owned === false
    && gpuMax(guest?.pool) === 3, { owner: owner?.pool, guest: guest?.pool });
  const adminNode = await relay.fetchQuery(fleet, relayOps.node, { id: config.poolId }).toPromise();
  check('relay: a fleet admin\'s node(id:) is null', adminNode.node === null, adminNode);
}

const failures = [];
for (const [name, run] of [['apollo', apolloChecks], ['urql', urqlChecks], ['relay', relayChecks]]) {
  try {
    await run();
  } catch (error) {
    failures.push(name);
    check(`${name}: ran`, false, String(error?.stack ?? error));
  }
}
const ok = results.filter((r) => r.ok).length;
console.log(JSON.stringify({ summary: { ok, failed: results.length - ok, crashed: failures } }));
