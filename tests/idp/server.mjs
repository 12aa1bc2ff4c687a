// Copyright (c) gpufleet.reliability contributors
// GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
// Test-only OpenID provider for the gpufleet.reliability OIDC tests. Listens on 127.0.0.1 only.
//
// Environment:
//   IDP_PORT        port (0 = any free port); the first stdout line is READY {"issuer":...,"pid":...}
//   IDP_JWKS        private JWKS file written by the test (RS256 and/or ES256 keys with kids)
//   IDP_ACCOUNTS    JSON file {accountId: {claims...}}; the claims go into ID and access tokens
//   IDP_DEVICE_TTL  device code lifetime in seconds (default 300)
//   IDP_SLOW_DOWN   answer the first N device-code token polls of each device code with slow_down
//   IDP_INTERVAL    "interval" added to device authorization responses (default 1)
// Every request is logged on stdout as "REQ <method> <path>" so tests can count IdP hits.
import http from 'node:http';
import fs from 'node:fs';

import Provider from 'oidc-provider';

const port = Number(process.env.IDP_PORT || 0);
const jwks = JSON.parse(fs.readFileSync(process.env.IDP_JWKS, 'utf8'));
const accounts = process.env.IDP_ACCOUNTS ? JSON.parse(fs.readFileSync(process.env.IDP_ACCOUNTS, 'utf8')) : {};
const deviceTTL = Number(process.env.IDP_DEVICE_TTL || 300);
const slowDown = Number(process.env.IDP_SLOW_DOWN || 0);
const interval = Number(process.env.IDP_INTERVAL || 1);
const resources = {
  'urn:gpufleet:ssh': { alg: 'RS256', scope: 'ssh' },
  'urn:gpufleet:ssh-es': { alg: 'ES256', scope: 'ssh' },
};

const server = http.createServer();
await new Promise((resolve) => { server.listen(port, '127.0.0.1', resolve); });
const issuer = `http://127.0.0.1:${server.address().port}`;

const userClaims = (id) => {
  const a = accounts[id];
  if (!a) return undefined;
  return { sub: id, sun: a.preferred_username, ...a };
};

const provider = new Provider(issuer, {
  jwks,
  clients: [
    {
      client_id: 'gpufleet-device',
      client_secret: 'device-secret',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code', 'refresh_token'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'client_secret_basic',
    },
    {
      client_id: 'gpufleet-public',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code'],
      response_types: [],
      redirect_uris: [],
      token_endpoint_auth_method: 'none',
      id_token_signed_response_alg: 'ES256',
    },
    {
      client_id: 'gpufleet-svc',
      client_secret: 'svc-secret',
      grant_types: ['client_credentials'],
      response_types: [],
      redirect_uris: [],
    },
  ],
  async findAccount(ctx, id) {
    if (!accounts[id]) return undefined;
    return { accountId: id, async claims() { return userClaims(id); } };
  },
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email', 'email_verified'],
    groups: ['groups'],
    slurm: ['sun'], // Slurm 22.05 reads the user from "sun" (or "username")
  },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups', 'ssh', 'slurm'],
  cookies: { keys: ['gpufleet-test-only-cookie-key'] },
  ttl: { AccessToken: 600, IdToken: 600, DeviceCode: deviceTTL, Grant: 3600, Interaction: 600, Session: 3600 },
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    revocation: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: async () => 'urn:gpufleet:ssh',
      useGrantedResource: async () => true,
      getResourceServerInfo: async (ctx, indicator) => {
        const r = resources[indicator];
        if (!r) throw new Provider.errors.InvalidTarget();
        return {
          scope: r.scope, audience: indicator, accessTokenTTL: 600, accessTokenFormat: 'jwt', jwt: { sign: { alg: r.alg } },
        };
      },
    },
  },
  // Copy user claims into JWT access tokens like a Keycloak/Okta mapper; "sun" is Slurm's user claim.
  async extraTokenClaims(ctx, token) {
    const c = token.accountId ? userClaims(token.accountId) : undefined;
    if (!c) return undefined;
    return {
      preferred_username: c.preferred_username, groups: c.groups, email: c.email, sun: c.preferred_username,
    };
  },
  async renderError(ctx, out) {
    ctx.type = 'json';
    ctx.body = out;
  },
});

const polls = new Map();
provider.use(async (ctx, next) => {
  console.log(`REQ ${ctx.method} ${ctx.path}`);
  if (slowDown && ctx.path === '/token' && ctx.method === 'POST') {
    // Peek the device_code without consuming the body for oidc-provider.
    const chunks = [];
    for await (const c of ctx.req) chunks.push(c);
    const raw = Buffer.concat(chunks);
    const params = new URLSearchParams(raw.toString());
    const dc = params.get('device_code');
    if (dc) {
      const n = (polls.get(dc) || 0) + 1;
      polls.set(dc, n);
      if (n <= slowDown) {
        ctx.status = 400;
        ctx.type = 'json';
        ctx.body = { error: 'slow_down', error_description: 'test IdP: poll slower' };
        return;
      }
    }
    // The stream is consumed: oidc-provider falls back to an already parsed body (req.body).
    ctx.req.body = raw.toString();
  }
  await next();
  if (ctx.path === '/device/auth' && ctx.status === 200 && ctx.body && typeof ctx.body === 'object') {
    ctx.body = { ...ctx.body, interval };
  }
});

server.on('request', provider.callback());
console.log(`READY ${JSON.stringify({ issuer, pid: process.pid })}`);

const sockets = new Set();
server.on('connection', (s) => { sockets.add(s); s.on('close', () => sockets.delete(s)); });
const stop = () => {
  server.close(() => process.exit(0));
  for (const s of sockets) s.destroy();
  setTimeout(() => process.exit(0), 2000).unref();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
