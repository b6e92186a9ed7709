// lockproxy's LOCK, EXTEND and UNLOCK from node-redis, in RESP2 and RESP3,
// checking every reply (exit 1 on the first mismatch).
//   npm ci && LOCKPROXY_ADDR=127.0.0.1:6380 node node-redis.js
"use strict";
const { createClient } = require("redis");

const [host, port] = (process.env.LOCKPROXY_ADDR || "127.0.0.1:6380").split(/:(?=\d+$)/);
const RES = "example:node-redis", DATA = "example:node-redis:data";

// Writes ARGV[2] to KEYS[1] unless a newer fence already wrote there: the
// storage side of fencing.
const FENCED_SET = `local f = tonumber(redis.call("HGET", KEYS[1], "fence") or "0")
if tonumber(ARGV[1]) < f then return 0 end
redis.call("HSET", KEYS[1], "fence", ARGV[1], "value", ARGV[2]) return 1`;

function check(ok, what, got) {
  if (!ok) throw new Error(`FAIL ${what}: got ${JSON.stringify(got)}`);
}

// One connection per client, and no reconnect: token-less EXTEND/UNLOCK
// need the connection that holds the lock. sendCommand takes strings only.
async function connect(RESP) {
  const client = createClient({ socket: { host, port: Number(port), reconnectStrategy: false }, RESP });
  client.on("error", (err) => console.error("node-redis:", err.message));
  return client.connect();
}

async function example(protocol) {
  const redis = await connect(protocol);
  const reply = await redis.sendCommand(["LOCK", RES, "10000", "WAIT", "2000"]); // null: not acquired
  check(Array.isArray(reply) && reply.length === 3, "LOCK", reply);
  const [token, validityMs, fence] = reply;
  check(token.length >= 16 && validityMs > 0 && validityMs <= 10000 && fence > 0, "LOCK reply", reply);

  // The work, guarded by the fence; an older fence is refused.
  let n = await redis.eval(FENCED_SET, { keys: [DATA], arguments: [String(fence), `resp${protocol}`] });
  check(n === 1, "fenced write", n);
  n = await redis.eval(FENCED_SET, { keys: [DATA], arguments: [String(fence - 1), "stale"] });
  check(n === 0, "stale write", n);
  const value = await redis.hGet(DATA, "value");
  check(value === `resp${protocol}`, "HGET", value);

  // A second client without WAIT gets the null reply: null.
  const other = await connect(protocol);
  const got = await other.sendCommand(["LOCK", RES, "10000"]);
  check(got === null, "second LOCK", got);
  other.destroy();

  n = await redis.sendCommand(["EXTEND", RES, "10000", token]);
  check(n > 0, "EXTEND", n);
  check(await redis.sendCommand(["UNLOCK", RES, token]) === 1, "UNLOCK", token);
  check(await redis.sendCommand(["UNLOCK", RES, token]) === 0, "UNLOCK again", token);

  // Again, leaving out the token on the connection that holds the lock.
  const again = await redis.sendCommand(["LOCK", RES, "10000"]);
  check(Array.isArray(again) && again[2] > fence, "LOCK again", again);
  n = await redis.sendCommand(["EXTEND", RES, "5000"]);
  check(n > 0, "EXTEND without token", n);
  n = await redis.sendCommand(["UNLOCK", RES]);
  check(n === 1, "UNLOCK without token", n);
  await redis.close();
  console.log(`node-redis RESP${protocol}: ok (fence ${fence}, then ${again[2]})`);
}

(async () => {
  for (const protocol of [2, 3]) await example(protocol);
})().catch((err) => {
  console.error(err.message);
  process.exit(1);
});
