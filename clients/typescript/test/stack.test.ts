// Tests of the client against a real chatpipe stack. e2e/tsclient_test.go
// starts `chatpipe dev` (two workers) and runs these with:
//
//   CHATPIPE_WS_URL      the gateway's websocket URL
//   CHATPIPE_JWT_SECRET  the stack's HS256 secret (tokens are minted here)
//   CHATPIPE_CONTROL_DIR where the worker-kill test writes "kill-worker" and
//                        waits for "worker-killed" (the Go test kills one of
//                        the two workers with kill -9 in between)
//   CHATPIPE_RUN         a suffix that keeps ids apart across runs
//   CHATPIPE_E2E_REQUIRED=1 makes missing variables a failure, not a skip.
//
// Without CHATPIPE_WS_URL they are skipped (npm test on its own runs the
// fake-gateway tests only).

import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import net from "node:net";
import { join } from "node:path";
import { after, test } from "node:test";
import WebSocket from "ws";

import { type ChatEvent, Client, type ClientOptions } from "../src/index.js";

const WS = WebSocket; // the `ws` package fits the client's WebSocketConstructor as it is
const wsURL = process.env.CHATPIPE_WS_URL ?? "";
const secret = process.env.CHATPIPE_JWT_SECRET ?? "";
const controlDir = process.env.CHATPIPE_CONTROL_DIR ?? "";
const run = process.env.CHATPIPE_RUN ?? String(Date.now());
const required = process.env.CHATPIPE_E2E_REQUIRED === "1";

if (required) {
  test("the stack's environment is given", () => {
    assert.ok(wsURL, "CHATPIPE_WS_URL is not set");
    assert.ok(secret, "CHATPIPE_JWT_SECRET is not set");
    assert.ok(controlDir, "CHATPIPE_CONTROL_DIR is not set");
  });
}
const skip = wsURL && secret ? false : "CHATPIPE_WS_URL and CHATPIPE_JWT_SECRET not set: no chatpipe stack to test against";

function b64url(s: string | Buffer): string {
  return Buffer.from(s).toString("base64url");
}

/** An HS256 JWT for user, as `chatpipe token` mints it. */
function mint(user: string, ttlSeconds = 3600): string {
  const now = Math.floor(Date.now() / 1000);
  const head = b64url(JSON.stringify({ alg: "HS256", typ: "JWT" }));
  const body = b64url(JSON.stringify({ sub: user, iat: now, exp: now + ttlSeconds }));
  const sig = createHmac("sha256", secret).update(`${head}.${body}`).digest("base64url");
  return `${head}.${body}.${sig}`;
}

const clients: Client[] = [];
const proxies: Proxy[] = [];

after(async () => {
  for (const c of clients) await c.close();
  for (const p of proxies) await p.close();
});

async function connect(user: string, url = wsURL, opts: ClientOptions = {}): Promise<Client> {
  const c = await Client.connect(url, () => mint(user), { WebSocket: WS, baseBackoffMs: 50, ...opts });
  clients.push(c);
  return c;
}

function id(name: string): string {
  return `ts-${name}-${run}`;
}

async function waitUntil(what: string, cond: () => boolean | Promise<boolean>, ms = 30_000, everyMs = 50): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * A TCP proxy in front of the gateway that can break connections under a
 * client: cut closes them, swallow drops what the server sends (answers are
 * lost, requests still arrive), offline refuses new connections.
 */
class Proxy {
  swallow = false;
  offline = false;
  private readonly server: net.Server;
  private readonly socks = new Set<net.Socket>();
  private readonly upstream: URL;
  url = "";

  constructor(target: string) {
    this.upstream = new URL(target);
    this.server = net.createServer((down) => {
      if (this.offline) return void down.destroy();
      const up = net.connect(Number(this.upstream.port), this.upstream.hostname);
      this.socks.add(down).add(up);
      const end = () => {
        down.destroy();
        up.destroy();
        this.socks.delete(down);
        this.socks.delete(up);
      };
      down.on("data", (b) => up.write(b));
      up.on("data", (b) => {
        if (!this.swallow) down.write(b);
      });
      for (const s of [down, up]) {
        s.on("error", end);
        s.on("close", end);
      }
    });
  }

  async start(): Promise<this> {
    await new Promise<void>((resolve) => this.server.listen(0, "127.0.0.1", resolve));
    const u = new URL(this.upstream);
    u.host = `127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
    this.url = u.toString();
    proxies.push(this);
    return this;
  }

  cut(): void {
    for (const s of this.socks) s.destroy();
    this.socks.clear();
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

function bodies(evs: ChatEvent[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const e of evs) if (e.kind === "message") m.set(e.body ?? "", (m.get(e.body ?? "") ?? 0) + 1);
  return m;
}

function assertContiguous(conv: string, evs: ChatEvent[]): void {
  evs.forEach((e, i) => assert.equal(e.seq, i + 1, `${conv}: seqs ${evs.map((x) => x.seq).join(",")}`));
}

test("history right after create returns the events", { skip }, async () => {
  const alice = await connect(`ts-hist-a-${run}`);
  const conv = id("hist");
  const created = await alice.create(conv, [`ts-hist-b-${run}`]);
  assert.equal(created.seq, 1);
  const h1 = await alice.history(conv);
  assert.deepEqual(h1.map((e) => [e.seq, e.kind]), [[1, "create"]]);
  assert.deepEqual([...(h1[0]!.members ?? [])].sort(), [`ts-hist-a-${run}`, `ts-hist-b-${run}`].sort());
  const sent = await alice.send(conv, "first");
  const h2 = await alice.history(conv);
  assert.deepEqual(h2.map((e) => [e.seq, e.kind, e.body]), [[1, "create", undefined], [sent.seq, "message", "first"]]);
  assert.equal(h2[1]!.clientMessageId, sent.clientMessageId);
  const list = await alice.listConversations({ limit: 10 });
  assert.deepEqual(list.map((c) => [c.conversationId, c.lastSeq]), [[conv, 2]]);
});

test("a send survives a forced disconnect with exactly one message", { skip }, async () => {
  const px = await new Proxy(wsURL).start();
  const [ua, ub] = [`ts-cut-a-${run}`, `ts-cut-b-${run}`];
  const alice = await connect(ua, px.url);
  const bob = await connect(ub, wsURL, { batch: true });
  await bob.waitSynced();
  const conv = id("cut");
  await alice.create(conv, [ub]);
  await alice.history(conv); // read your writes: visible from here on

  px.swallow = true; // answers to alice are lost from here on
  let settled = false;
  const sending = alice.send(conv, "through a cut").finally(() => {
    settled = true;
  });
  // bob sees the message: it was committed, and alice has not heard.
  let seq = 0;
  await waitUntil("bob to get the message", () => {
    const e = bob.messages(conv).find((x) => x.body === "through a cut");
    if (e) seq = e.seq;
    return e !== undefined;
  });
  assert.equal(settled, false, "the send settled while its answers were swallowed");
  px.swallow = false;
  px.cut();
  const accepted = await sending;
  assert.equal(accepted.seq, seq, "the retry after the reconnect answers the first accepted");
  assert.ok(alice.connects >= 2, `alice connected ${alice.connects} times`);
  const hist = await alice.historyAll(conv, { pageSize: 200 });
  assert.equal(bodies(hist).get("through a cut"), 1);
  assert.equal(hist.length, 2);
  assertContiguous(conv, hist);
  await alice.waitSynced();
  await waitUntil("alice's view to hold the message", () => alice.messages(conv).length === 2);
});

test("an offline device converges through sync and duplicates are dropped", { skip }, async () => {
  const px = await new Proxy(wsURL).start();
  const [ua, ub] = [`ts-off-a-${run}`, `ts-off-b-${run}`];
  const alice = await connect(ua);
  const conv = id("off");
  const delivered = new Map<number, number>();
  const framesSeen = new Map<number, number>();
  const bob = await connect(ub, px.url, {
    batch: true,
    onEvent: (e) => {
      if (e.conversationId === conv) delivered.set(e.seq, (delivered.get(e.seq) ?? 0) + 1);
    },
    onFrame: (raw) => {
      const f = JSON.parse(raw) as { op: string; conversation_id?: string; seq?: number };
      if (f.op === "event" && f.conversation_id === conv) framesSeen.set(f.seq!, (framesSeen.get(f.seq!) ?? 0) + 1);
    },
  });
  await bob.waitSynced();
  await alice.create(conv, [ub]);
  const online = 5;
  const offline = 30;
  for (let i = 0; i < online; i++) await alice.send(conv, `m${i}`);
  await waitUntil("bob to get the pushes", () => bob.messages(conv).length === 1 + online);
  assert.equal(bob.cursors()[conv] ?? 0, 0, "the cursor moved on pushes alone");

  px.offline = true; // bob goes offline and cannot come back
  px.cut();
  for (let i = online; i < online + offline; i++) await alice.send(conv, `m${i}`);
  assert.equal(bob.messages(conv).length, 1 + online, "bob got events while offline");
  const want = 1 + online + offline;
  // A sync returns what the read model holds and sets the cursor there;
  // what persist applies to it later comes as pushes, which move no
  // cursor (docs/architecture.md, rule 15). Bob comes back once it holds
  // every send, so that his sync is the one that converges him.
  await waitUntil("alice's history to hold every send", async () => (await alice.historyAll(conv, { pageSize: 200 })).length === want);
  px.offline = false;
  await waitUntil("bob to converge", () => bob.cursors()[conv] === want && bob.messages(conv).length === want, 60_000);
  const view = bob.messages(conv);
  assertContiguous(conv, view);
  view.slice(1).forEach((e, i) => assert.equal(e.body, `m${i}`));
  const hist = await alice.historyAll(conv, { pageSize: 200 });
  assert.deepEqual(hist.map((e) => e.seq), view.map((e) => e.seq));
  // The online pushes came again in bob's sync; each was delivered once.
  let dups = 0;
  for (let seq = 1; seq <= want; seq++) {
    assert.equal(delivered.get(seq), 1, `seq ${seq} delivered ${delivered.get(seq) ?? 0} times`);
    if ((framesSeen.get(seq) ?? 0) > 1) dups++;
  }
  assert.ok(dups >= online, `only ${dups} seqs came twice; dedupe was not exercised`);
  assert.ok(bob.connects >= 2);
});

test("sends survive a worker kill with exactly one message each", { skip: skip || (controlDir ? false : "CHATPIPE_CONTROL_DIR not set") }, async (t) => {
  const [ua, ub] = [`ts-kill-a-${run}`, `ts-kill-b-${run}`];
  const alice = await connect(ua);
  const convs = Array.from({ length: 4 }, (_, i) => id(`kill-${i}`));
  for (const c of convs) await alice.create(c, [ub]);
  const perConv = 25;
  let sent = 0;
  let slowest = 0;
  const loops = convs.map(async (c) => {
    for (let j = 0; j < perConv; j++) {
      const start = Date.now();
      await alice.send(c, `b${j}`);
      slowest = Math.max(slowest, Date.now() - start);
      sent++;
    }
  });
  await waitUntil("sends to flow", () => sent >= convs.length * 3);
  const killedAt = sent;
  writeFileSync(join(controlDir, "kill-worker"), `${sent}\n`);
  await waitUntil("the worker to be killed", () => existsSync(join(controlDir, "worker-killed")), 30_000);
  const afterKill = sent;
  await Promise.all(loops);
  assert.ok(afterKill < convs.length * perConv, `every send finished before the kill (asked after ${killedAt})`);
  t.diagnostic(`kill asked after ${killedAt} sends, done after ${afterKill} of ${convs.length * perConv}; slowest send ${slowest} ms`);
  for (const c of convs) {
    let hist: ChatEvent[] = [];
    await waitUntil(`${c} in history`, async () => {
      hist = await alice.historyAll(c, { pageSize: 200 });
      return hist.length >= 1 + perConv;
    });
    const b = bodies(hist);
    for (let j = 0; j < perConv; j++) assert.equal(b.get(`b${j}`), 1, `${c}: b${j} stored ${b.get(`b${j}`) ?? 0} times`);
    assert.equal(hist.length, 1 + perConv);
    assertContiguous(c, hist);
  }
});

// --- read markers (the read op, pushed read frames, synced.read, conversations' read_seq and unread)

/** Sends one raw frame on a connection of its own and returns the answer with its id (no coalescing, no retries). */
async function rawRequest(user: string, frame: Record<string, unknown>): Promise<Record<string, any>> {
  const u = new URL(wsURL);
  u.searchParams.set("token", mint(user));
  const ws = new WebSocket(u.toString());
  try {
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("error", reject);
    });
    const id = `raw-${Date.now()}`;
    const answer = new Promise<Record<string, any>>((resolve) => {
      ws.on("message", (data) => {
        for (const part of String(data).split("\n")) {
          const f = JSON.parse(part) as Record<string, any>;
          if (f.id === id) resolve(f);
        }
      });
    });
    ws.send(JSON.stringify({ ...frame, id }));
    return await answer;
  } finally {
    ws.close();
  }
}

test("two devices of one user see the same read marker; a lower marker is ignored", { skip }, async () => {
  const [ua, ub] = [`ts-read-a-${run}`, `ts-read-b-${run}`];
  const alice = await connect(ua);
  const conv = id("read");
  await alice.create(conv, [ub]);
  let last = 0;
  for (let i = 0; i < 5; i++) last = (await alice.send(conv, `r${i}`)).seq;
  const phone = await connect(ub);
  const laptop = await connect(ub, wsURL, { batch: true });
  const laptopSaw: number[] = [];
  laptop.addEventListener("read", (ev) => {
    const m = (ev as unknown as { detail: { conversationId: string; seq: number } }).detail;
    if (m.conversationId === conv) laptopSaw.push(m.seq);
  });
  await Promise.all([phone.waitSynced(), laptop.waitSynced()]);
  await waitUntil("both devices to hold the messages", () => phone.messages(conv).length === last && laptop.messages(conv).length === last);
  assert.equal(phone.unread(conv, ub), 5);

  assert.equal(await phone.markRead(conv, last - 1), last - 1);
  await waitUntil("the laptop to get the phone's marker", () => laptop.readSeq(conv) === last - 1);
  assert.equal(phone.readSeq(conv), last - 1);
  assert.equal(laptop.unread(conv, ub), 1);

  // A lower marker, sent as it is (the client would not send it): accepted,
  // and nothing moves back.
  const low = await rawRequest(ub, { op: "read", conversation_id: conv, seq: 2 });
  assert.equal(low.op, "accepted", JSON.stringify(low));
  assert.equal(low.seq, 2);
  await waitUntil("the read model to have the marker", async () => {
    const list = await phone.listConversations();
    return list.find((c) => c.conversationId === conv)?.readSeq === last - 1;
  }, 30_000, 250);
  const later = await connect(ub); // a device that was away learns it from synced.read
  await later.waitSynced();
  assert.equal(later.readSeq(conv), last - 1);
  assert.equal(phone.readSeq(conv), last - 1);
  assert.equal(laptop.readSeq(conv), last - 1);
  assert.ok(laptopSaw.every((s, i) => i === 0 || s > laptopSaw[i - 1]!), `the laptop's marker went ${laptopSaw}`);

  // The laptop reads to the end; the phone follows.
  assert.equal(await laptop.markRead(conv, last), last);
  await waitUntil("the phone to get the laptop's marker", () => phone.readSeq(conv) === last);
  assert.equal(phone.unread(conv, ub), 0);

  // Past the last seq, and not a member.
  const past = await rawRequest(ub, { op: "read", conversation_id: conv, seq: last + 10 });
  assert.deepEqual([past.op, past.code], ["rejected", "bad_request"], JSON.stringify(past));
  const stranger = await rawRequest(`ts-read-c-${run}`, { op: "read", conversation_id: conv, seq: 1 });
  assert.deepEqual([stranger.op, stranger.code], ["rejected", "forbidden"], JSON.stringify(stranger));
});

test("unread counts are right after a burst of messages from another member", { skip }, async () => {
  const [ua, ub] = [`ts-unread-a-${run}`, `ts-unread-b-${run}`];
  const alice = await connect(ua);
  const bob = await connect(ub);
  await bob.waitSynced();
  const conv = id("unread");
  await alice.create(conv, [ub]);
  const burst = 30;
  const sent = await Promise.all(Array.from({ length: burst }, (_, i) => alice.send(conv, `u${i}`)));
  const seqs = sent.map((a) => a.seq).sort((a, b) => a - b);
  const own = [(await bob.send(conv, "mine 1")).seq, (await bob.send(conv, "mine 2")).seq];
  const last = Math.max(...own);
  assert.equal(last, 1 + burst + 2);
  await waitUntil("bob's view to hold everything", () => bob.messages(conv).length === last);
  assert.equal(bob.unread(conv, ub), burst, "bob's own messages are not unread");

  const entry = async () => (await bob.listConversations()).find((c) => c.conversationId === conv);
  await waitUntil("the read model to count the burst", async () => (await entry())?.unread === burst, 30_000, 250);
  let e = await entry();
  assert.deepEqual(e && [e.lastSeq, e.readSeq, e.unread], [last, 0, burst]);

  // Read up to the tenth message of the burst: twenty are left.
  const mark = seqs[9]!;
  assert.equal(await bob.markRead(conv, mark), mark);
  assert.equal(bob.unread(conv, ub), burst - 10);
  await waitUntil("the read model to count from the marker", async () => (await entry())?.readSeq === mark, 30_000, 250);
  e = await entry();
  assert.deepEqual(e && [e.lastSeq, e.readSeq, e.unread], [last, mark, burst - 10]);

  // More from alice while bob is not looking.
  for (let i = 0; i < 3; i++) await alice.send(conv, `v${i}`);
  await waitUntil("the read model to count the new ones", async () => (await entry())?.unread === burst - 10 + 3, 30_000, 250);
  await waitUntil("bob's view to hold them", () => bob.messages(conv).length === last + 3);
  assert.equal(bob.unread(conv, ub), burst - 10 + 3);
  // Alice's own list counts bob's two messages only.
  await waitUntil("alice's count of bob's two messages", async () => {
    const ae = (await alice.listConversations()).find((c) => c.conversationId === conv);
    return ae?.readSeq === 0 && ae.unread === 2;
  }, 30_000, 250);
});

test("refresh keeps a connection past its first token's expiry", { skip }, async () => {
  const user = `ts-refresh-${run}`;
  // Tokens of 2 s: refreshed halfway through their life, on the same
  // connection. Without it the connection's token would have expired (at
  // exp plus the gateway's leeway of a few seconds) before the send below.
  const c = await Client.connect(wsURL, () => mint(user, 2), { WebSocket: WS, baseBackoffMs: 50 });
  clients.push(c);
  await c.waitSynced();
  const conv = id("refresh");
  await c.create(conv, []);
  await new Promise((r) => setTimeout(r, 9000));
  const sent = await c.send(conv, "still here");
  assert.equal(sent.seq, 2);
  assert.equal(c.connects, 1, "the connection was dialled again instead of refreshed");
  assert.ok(c.refreshes >= 3, `refreshes: ${c.refreshes}`);
});
