// Tests of the client against a small in-process fake of the gateway (no
// chatpipe stack needed): retries, resends after a reconnect, the view's
// de-duplication and order, sync paging and batched frames, read markers.

import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import WebSocket, { WebSocketServer } from "ws";

import { backoff, type ChatEvent, ChatpipeError, Client, type ReadMarker } from "../src/index.js";

const WS = WebSocket; // the `ws` package fits the client's WebSocketConstructor as it is

type Req = Record<string, any>;

/**
 * A fake gateway: one conversation store with dedupe by client_message_id,
 * sync paged by pageSize, history, conversations, the read markers of its
 * one user (pushed to every connection when they move, in synced.read),
 * and a hook that can answer a request itself ("drop" closes the
 * connection unanswered, "ignore" leaves it unanswered, an object is sent
 * as the answer).
 */
class Fake {
  readonly wss: WebSocketServer;
  readonly requests: Req[] = [];
  readonly tokens: string[] = [];
  readonly protocols: string[] = [];
  hook: ((r: Req, ws: WebSocket) => "drop" | "ignore" | object | undefined) | undefined;
  batchPushes = false;
  syncPage = 500;
  readonly markers = new Map<string, number>();
  private events = new Map<string, Req[]>();
  private accepted = new Map<string, Req>();
  private socks = new Set<WebSocket>();

  constructor() {
    this.wss = new WebSocketServer({ port: 0, host: "127.0.0.1", handleProtocols: (ps) => (ps.has("chatpipe.v1.batch") ? "chatpipe.v1.batch" : false) });
    this.wss.on("connection", (ws, req) => {
      this.tokens.push(new URL(req.url ?? "/", "http://x").searchParams.get("token") ?? "");
      this.protocols.push(ws.protocol);
      this.socks.add(ws);
      ws.on("close", () => this.socks.delete(ws));
      ws.on("message", (data) => this.onRequest(ws, JSON.parse(String(data)) as Req));
    });
  }

  get url(): string {
    return `ws://127.0.0.1:${(this.wss.address() as AddressInfo).port}/v1/ws`;
  }

  /** Closes every connection (the clients reconnect). */
  cutAll(): void {
    for (const s of this.socks) s.terminate();
  }

  /** Appends an event to conv and pushes it to every connection. */
  append(conv: string, e: Req): Req {
    const list = this.events.get(conv) ?? [];
    this.events.set(conv, list);
    const ev = { conversation_id: conv, seq: list.length + 1, message_id: `id-${conv}-${list.length + 1}`, sender: "u1", created_at: "2026-12-01T00:00:00Z", ...e };
    list.push(ev);
    return ev;
  }

  push(ev: Req, ...extra: Req[]): void {
    const frames = [ev, ...extra].map((x) => JSON.stringify({ op: "event", ...x }));
    for (const s of this.socks) {
      if (this.batchPushes && s.protocol === "chatpipe.v1.batch") s.send(frames.join("\n"));
      else for (const f of frames) s.send(f);
    }
  }

  stored(conv: string): Req[] {
    return this.events.get(conv) ?? [];
  }

  /** Sends a pushed frame to every connection. */
  pushFrame(f: Req): void {
    for (const s of this.socks) s.send(JSON.stringify(f));
  }

  private onRequest(ws: WebSocket, r: Req): void {
    this.requests.push(r);
    const h = this.hook?.(r, ws);
    if (h === "drop") return void ws.terminate();
    if (h === "ignore") return;
    if (h) return void ws.send(JSON.stringify({ id: r.id, ...h }));
    this.answer(ws, r);
  }

  /** Answers r as the gateway would (a test that held a request with "ignore" releases it with this). */
  answer(ws: WebSocket, r: Req): void {
    const reply = (f: Req) => ws.send(JSON.stringify({ id: r.id, ...f }));
    switch (r.op) {
      case "create":
      case "send": {
        const key = `${r.conversation_id}/${r.client_message_id}`;
        let a = this.accepted.get(key);
        if (!a) {
          const ev =
            r.op === "create"
              ? this.append(r.conversation_id, { kind: "create", members: ["u1", ...(r.members ?? [])] })
              : this.append(r.conversation_id, { kind: "message", body: r.body, client_message_id: r.client_message_id });
          a = { op: "accepted", conversation_id: r.conversation_id, seq: ev.seq, message_id: ev.message_id, client_message_id: r.client_message_id };
          this.accepted.set(key, a);
          reply(a);
          this.push(ev);
        } else reply(a);
        return;
      }
      case "sync": {
        const cursors: Record<string, number> = {};
        let budget = this.syncPage;
        let more = false;
        for (const [conv, list] of this.events) {
          let cur = r.cursors?.[conv] ?? 0;
          for (const ev of list) {
            if (ev.seq <= cur) continue;
            if (budget === 0) {
              more = true;
              break;
            }
            ws.send(JSON.stringify({ op: "event", ...ev }));
            budget--;
            cur = ev.seq;
          }
          cursors[conv] = cur;
        }
        const read: Record<string, number> = {};
        for (const conv of Object.keys(cursors)) if (this.markers.has(conv)) read[conv] = this.markers.get(conv)!;
        const synced: Req = { op: "synced", cursors };
        if (more) synced.more = true;
        if (Object.keys(read).length > 0) synced.read = read;
        return reply(synced);
      }
      case "history": {
        const list = this.stored(r.conversation_id);
        const before = r.before_seq || Infinity;
        const limit = r.limit || 50;
        const evs = list.filter((e) => e.seq < before).slice(-limit);
        return reply({ op: "history", conversation_id: r.conversation_id, events: evs });
      }
      case "read": {
        const last = this.stored(r.conversation_id).length;
        if (last === 0) return reply({ op: "rejected", code: "forbidden", message: "not a member" });
        if (!(r.seq >= 1) || r.seq > last) return reply({ op: "rejected", code: "bad_request", message: `seq past ${last}` });
        const moved = r.seq > (this.markers.get(r.conversation_id) ?? 0);
        if (moved) this.markers.set(r.conversation_id, r.seq);
        reply({ op: "accepted", conversation_id: r.conversation_id, seq: r.seq });
        if (moved) this.pushFrame({ op: "read", conversation_id: r.conversation_id, seq: r.seq });
        return;
      }
      case "refresh": {
        this.tokens.push(r.token);
        reply({ op: "accepted", expires_at: "2026-12-01T00:00:00Z" });
        return;
      }
      case "conversations": {
        const list = [...this.events].map(([conv, evs]) => {
          const readSeq = this.markers.get(conv) ?? 0;
          const unread = evs.filter((e) => e.seq > readSeq && e.kind === "message" && e.sender !== "me").length;
          return { conversation_id: conv, last_seq: evs.length, last_activity_at: "2026-12-01T00:00:00Z", read_seq: readSeq, unread };
        });
        return reply({ op: "conversations", conversations: list });
      }
      default:
        return reply({ op: "rejected", code: "bad_request", message: "unknown op" });
    }
  }

  close(): Promise<void> {
    this.cutAll();
    return new Promise((resolve) => this.wss.close(() => resolve()));
  }
}

let fake: Fake;
const clients: Client[] = [];

before(async () => {
  fake = new Fake();
  await new Promise((resolve) => fake.wss.once("listening", resolve));
});

after(async () => {
  for (const c of clients) await c.close();
  await fake.close();
});

async function connect(opts: Parameters<typeof Client.connect>[2] = {}): Promise<Client> {
  const c = await Client.connect(fake.url, "tok", { WebSocket: WS, baseBackoffMs: 20, ...opts });
  clients.push(c);
  return c;
}

function waitUntil(what: string, cond: () => boolean, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  return new Promise((resolve, reject) => {
    const tick = () => {
      if (cond()) return resolve();
      if (Date.now() > deadline) return reject(new Error(`timed out waiting for ${what}`));
      setTimeout(tick, 10);
    };
    tick();
  });
}

test("backoff is full jitter below min(max, base × 2^n)", () => {
  assert.equal(backoff(0, 250, 30_000, () => 0.999999), 250);
  assert.equal(backoff(3, 250, 30_000, () => 0.999999), 2000);
  assert.equal(backoff(20, 250, 30_000, () => 0.999999), 30_000);
  assert.equal(backoff(5, 250, 30_000, () => 0), 0);
  for (let i = 0; i < 100; i++) {
    const d = backoff(2, 100, 1000);
    assert.ok(d >= 0 && d <= 400, `backoff ${d}`);
  }
});

test("without a WebSocket implementation connect says what to pass", async () => {
  const g = globalThis as { WebSocket?: unknown };
  const saved = g.WebSocket;
  delete g.WebSocket;
  try {
    await assert.rejects(Client.connect(fake.url, "tok"), /options\.WebSocket/);
  } finally {
    if (saved !== undefined) g.WebSocket = saved;
  }
});

test("unavailable and rate_limited are retried with the same client_message_id after retry_after_ms", async () => {
  const c = await connect();
  await c.waitSynced();
  let n = 0;
  fake.hook = (r) => {
    if (r.op !== "send") return undefined;
    n++;
    if (n === 1) return { op: "rejected", code: "unavailable", message: "moving", retry_after_ms: 150 };
    if (n === 2) return { op: "rejected", code: "rate_limited", message: "slow down", retry_after_ms: 100 };
    return undefined;
  };
  const start = Date.now();
  const a = await c.send("f-1", "hello");
  fake.hook = undefined;
  assert.ok(Date.now() - start >= 240, `retried after ${Date.now() - start} ms`);
  const sends = fake.requests.filter((r) => r.op === "send" && r.conversation_id === "f-1");
  assert.equal(sends.length, 3);
  assert.equal(new Set(sends.map((r) => r.client_message_id)).size, 1);
  assert.equal(new Set(sends.map((r) => r.id)).size, 3, "each attempt has its own request id");
  assert.equal(a.clientMessageId, sends[0]!.client_message_id);
  assert.equal(fake.stored("f-1").length, 1);
});

test("a final rejection rejects with its code", async () => {
  const c = await connect();
  fake.hook = (r) => (r.op === "send" ? { op: "rejected", code: "forbidden", message: "not a member" } : undefined);
  try {
    await assert.rejects(c.send("f-2", "x"), (err: unknown) => err instanceof ChatpipeError && err.code === "forbidden" && err.conversationId === "f-2");
  } finally {
    fake.hook = undefined;
  }
});

test("a send unanswered when its connection drops goes out again with the same ids: one message", async () => {
  const c = await connect();
  await c.waitSynced();
  let dropped = false;
  fake.hook = (r) => {
    if (r.op === "send" && !dropped) {
      dropped = true;
      return "drop";
    }
    return undefined;
  };
  const a = await c.send("f-3", "through a cut");
  fake.hook = undefined;
  const sends = fake.requests.filter((r) => r.op === "send" && r.conversation_id === "f-3");
  assert.equal(sends.length, 2);
  assert.equal(sends[0]!.client_message_id, sends[1]!.client_message_id);
  assert.equal(sends[0]!.id, sends[1]!.id, "resent with the same request id");
  assert.equal(a.seq, 1);
  assert.ok(c.connects >= 2);
  assert.equal(fake.stored("f-3").length, 1);
});

test("a send with no answer in time is sent again with the same client_message_id", async () => {
  const c = await connect({ requestTimeoutMs: 150 });
  let first = true;
  fake.hook = (r) => {
    if (r.op === "send" && first) {
      first = false;
      return "ignore";
    }
    return undefined;
  };
  await c.send("f-4", "late");
  fake.hook = undefined;
  const sends = fake.requests.filter((r) => r.op === "send" && r.conversation_id === "f-4");
  assert.equal(sends.length, 2);
  assert.equal(sends[0]!.client_message_id, sends[1]!.client_message_id);
  assert.equal(c.connects, 1);
});

test("the view drops duplicates and keeps seq order; cursors move only on synced; sync pages with more", async () => {
  for (let i = 0; i < 7; i++) fake.append("f-5", { kind: "message", body: `m${i}` });
  fake.syncPage = 3;
  const delivered: ChatEvent[] = [];
  const dispatched: number[] = [];
  const c = await connect({ batch: true, onEvent: (e) => e.conversationId === "f-5" && delivered.push(e) });
  c.addEventListener("event", (ev) => {
    const e = (ev as unknown as { detail: ChatEvent }).detail;
    if (e.conversationId === "f-5") dispatched.push(e.seq);
  });
  await c.waitSynced();
  fake.syncPage = 500;
  assert.equal(c.cursors()["f-5"], 7);
  const syncs = fake.requests.filter((r) => r.op === "sync").slice(-3);
  assert.deepEqual(syncs.map((r) => r.cursors["f-5"] ?? 0), [0, 3, 6]);
  // pushes out of order and again, batched in one message
  fake.batchPushes = true;
  const e9 = fake.append("f-5", { kind: "message", body: "m7" });
  const e8 = { ...e9 };
  const e10 = fake.append("f-5", { kind: "message", body: "m8" });
  fake.push(e10, e8, fake.stored("f-5")[2]!);
  fake.batchPushes = false;
  await waitUntil("the pushes", () => c.messages("f-5").length === 9);
  assert.equal(c.cursors()["f-5"], 7, "pushes alone do not move the cursor");
  assert.deepEqual(c.messages("f-5").map((e) => e.seq), [1, 2, 3, 4, 5, 6, 7, 8, 9]);
  assert.deepEqual(delivered.map((e) => e.seq), [1, 2, 3, 4, 5, 6, 7, 9, 8]);
  assert.deepEqual(dispatched, delivered.map((e) => e.seq));
  assert.equal(fake.protocols.at(-1), "chatpipe.v1.batch");
  await c.sync();
  assert.equal(c.cursors()["f-5"], 9);
  assert.equal(delivered.length, 9, "the sync's events were all seen: nothing delivered again");
});

test("history pages backwards and fills the view without delivering", async () => {
  for (let i = 0; i < 12; i++) fake.append("f-6", { kind: "message", body: `h${i}` });
  const delivered: ChatEvent[] = [];
  const c = await connect({ cursors: { "f-6": 12 }, onEvent: (e) => e.conversationId === "f-6" && delivered.push(e) });
  await c.waitSynced();
  const page = await c.history("f-6", { beforeSeq: 5, limit: 3 });
  assert.deepEqual(page.map((e) => e.seq), [2, 3, 4]);
  const all = await c.historyAll("f-6", { pageSize: 5 });
  assert.deepEqual(all.map((e) => e.seq), Array.from({ length: 12 }, (_, i) => i + 1));
  assert.equal(all[0]!.body, "h0");
  assert.equal(c.messages("f-6").length, 12);
  assert.equal(delivered.length, 0);
});

test("a token provider is asked at every dial", async () => {
  let n = 0;
  const c = await connect();
  await c.close();
  const d = await Client.connect(fake.url, () => `tok-${++n}`, { WebSocket: WS, baseBackoffMs: 10 });
  clients.push(d);
  await d.waitSynced();
  fake.cutAll();
  await waitUntil("the reconnect", () => d.connects === 2);
  await waitUntil("the other clients to reconnect", () => fake.tokens.filter((t) => t.startsWith("tok-")).length === 2);
  assert.deepEqual(fake.tokens.filter((t) => t.startsWith("tok-")), ["tok-1", "tok-2"]);
});

test("close rejects calls in flight and later calls", async () => {
  const c = await connect();
  fake.hook = (r) => (r.op === "send" ? "ignore" : undefined);
  const p = c.send("f-7", "never answered");
  await waitUntil("the send to arrive", () => fake.requests.some((r) => r.conversation_id === "f-7"));
  await c.close();
  fake.hook = undefined;
  await assert.rejects(p, (err: unknown) => err instanceof ChatpipeError && err.code === "closed");
  await assert.rejects(c.send("f-7", "after"), (err: unknown) => err instanceof ChatpipeError && err.code === "closed");
});

test("an aborted signal ends a call's retries", async () => {
  const c = await connect();
  fake.hook = (r) => (r.op === "send" ? { op: "rejected", code: "unavailable", message: "down", retry_after_ms: 50 } : undefined);
  try {
    await assert.rejects(c.send("f-8", "x", { signal: AbortSignal.timeout(300) }), /TimeoutError|aborted|timed out/i);
  } finally {
    fake.hook = undefined;
  }
  assert.ok(fake.requests.filter((r) => r.conversation_id === "f-8").length >= 2);
});

// --- read markers

/** The seqs of the "read" events a client dispatches for conv. */
function readEvents(c: Client, conv: string): number[] {
  const seen: number[] = [];
  c.addEventListener("read", (ev) => {
    const m = (ev as unknown as { detail: ReadMarker }).detail;
    if (m.conversationId === conv) seen.push(m.seq);
  });
  return seen;
}

function reads(conv: string): Req[] {
  return fake.requests.filter((r) => r.op === "read" && r.conversation_id === conv);
}

test("markRead coalesces: one read in flight per conversation, then only the highest asked for", async () => {
  for (let i = 0; i < 6; i++) fake.append("r-1", { kind: "message", body: `x${i}` });
  const c = await connect();
  await c.waitSynced();
  const held: { ws: WebSocket; r: Req }[] = [];
  fake.hook = (r, ws) => {
    if (r.op !== "read" || r.conversation_id !== "r-1" || held.length > 0) return undefined;
    held.push({ ws, r });
    return "ignore";
  };
  const p1 = c.markRead("r-1", 1);
  const p2 = c.markRead("r-1", 3);
  const p3 = c.markRead("r-1", 5);
  const p4 = c.markRead("r-1", 4);
  await waitUntil("the first read", () => held.length === 1);
  await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(reads("r-1").map((r) => r.seq), [1], "a second read went out while the first was in flight");
  fake.hook = undefined;
  fake.answer(held[0]!.ws, held[0]!.r);
  assert.deepEqual(await Promise.all([p1, p2, p3, p4]), [1, 5, 5, 5]);
  assert.deepEqual(reads("r-1").map((r) => r.seq), [1, 5]);
  assert.equal(c.readSeq("r-1"), 5);
  // At or below the marker nothing is sent.
  assert.equal(await c.markRead("r-1", 2), 5);
  assert.equal(reads("r-1").length, 2);
  // Reads of another conversation do not wait for these.
  fake.append("r-1b", { kind: "message", body: "y" });
  assert.equal(await c.markRead("r-1b", 1), 1);
});

test("the marker is the maximum: a lower accepted read, a lower pushed frame and a lower synced.read change nothing", async () => {
  for (let i = 0; i < 9; i++) fake.append("r-2", { kind: "message", body: `x${i}` });
  const c = await connect();
  await c.waitSynced();
  const seen = readEvents(c, "r-2");
  // The read of 5 is answered only after another device's 7 was pushed.
  const held: { ws: WebSocket; r: Req }[] = [];
  fake.hook = (r, ws) => {
    if (r.op !== "read" || r.conversation_id !== "r-2") return undefined;
    held.push({ ws, r });
    return "ignore";
  };
  const p5 = c.markRead("r-2", 5);
  await waitUntil("the read", () => held.length === 1);
  fake.hook = undefined;
  fake.markers.set("r-2", 7);
  fake.pushFrame({ op: "read", conversation_id: "r-2", seq: 7 });
  assert.equal(await p5, 7, "markRead resolves with the pushed marker that covers it");
  fake.answer(held[0]!.ws, held[0]!.r);
  // A lower pushed frame, and a stale read model in the next synced.
  fake.pushFrame({ op: "read", conversation_id: "r-2", seq: 4 });
  fake.markers.set("r-2", 3);
  await c.sync();
  fake.markers.set("r-2", 7);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(c.readSeq("r-2"), 7);
  assert.deepEqual(seen, [7], "a read event for a marker that did not move forward");
  assert.equal(await c.markRead("r-2", 6), 7, "below the marker: nothing to send");
  assert.equal(reads("r-2").length, 1);
  assert.equal(await c.markRead("r-2", 9), 9);
  assert.deepEqual(seen, [7, 9]);
  assert.equal(c.readMarkers()["r-2"], 9);
});

test("pushed read frames move the marker forward, out of order and repeated", async () => {
  for (let i = 0; i < 9; i++) fake.append("r-3", { kind: "message", body: `x${i}`, sender: i < 2 ? "me" : "u1" });
  const got: ReadMarker[] = [];
  const c = await connect({ onRead: (m) => m.conversationId === "r-3" && got.push(m) });
  await c.waitSynced();
  const seen = readEvents(c, "r-3");
  assert.equal(c.readSeq("r-3"), 0);
  assert.equal(c.unread("r-3", "me"), 7, "the other sender's messages are unread");
  fake.pushFrame({ op: "read", conversation_id: "r-3", seq: 6 });
  fake.pushFrame({ op: "read", conversation_id: "r-3", seq: 8 });
  fake.pushFrame({ op: "read", conversation_id: "r-3", seq: 5 });
  fake.pushFrame({ op: "read", conversation_id: "r-3", seq: 8 });
  await waitUntil("the pushed markers", () => c.readSeq("r-3") === 8);
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(c.readSeq("r-3"), 8);
  assert.deepEqual(seen, [6, 8]);
  assert.deepEqual(got.map((m) => m.seq), [6, 8]);
  assert.equal(c.unread("r-3", "me"), 1);
  // A markRead the pushed frames already cover resolves without a read.
  assert.equal(await c.markRead("r-3", 7), 8);
  assert.equal(reads("r-3").length, 0);
});

test("synced.read and conversations give an offline device its markers", async () => {
  for (let i = 0; i < 5; i++) fake.append("r-4", { kind: "message", body: `x${i}` });
  fake.markers.set("r-4", 3);
  const seen: ReadMarker[] = [];
  const c = await connect({ onRead: (m) => m.conversationId === "r-4" && seen.push(m) });
  await c.waitSynced();
  assert.equal(c.readSeq("r-4"), 3);
  assert.deepEqual(seen, [{ conversationId: "r-4", seq: 3 }]);
  assert.equal(c.unread("r-4", "me"), 2);
  // Moved while the device was away: the sync after the reconnect has it.
  fake.markers.set("r-4", 4);
  fake.cutAll();
  await waitUntil("the marker from the next synced", () => c.readSeq("r-4") === 4);
  const list = await c.listConversations();
  const e = list.find((x) => x.conversationId === "r-4");
  assert.deepEqual(e && [e.lastSeq, e.readSeq, e.unread], [5, 4, 1]);
  fake.markers.set("r-4", 5); // the conversations answer moves it too
  await c.listConversations();
  assert.equal(c.readSeq("r-4"), 5);
  assert.deepEqual(seen.map((m) => m.seq), [3, 4, 5]);
});

test("a read unanswered when its connection drops goes out again after the reconnect; rate_limited is retried after retry_after_ms", async () => {
  for (let i = 0; i < 4; i++) fake.append("r-5", { kind: "message", body: `x${i}` });
  const c = await connect();
  await c.waitSynced();
  let n = 0;
  fake.hook = (r) => {
    if (r.op !== "read" || r.conversation_id !== "r-5") return undefined;
    n++;
    if (n === 1) return "drop";
    if (n === 2) return { op: "rejected", code: "rate_limited", message: "slow down", retry_after_ms: 120 };
    return undefined;
  };
  const start = Date.now();
  const connects = c.connects;
  assert.equal(await c.markRead("r-5", 4), 4);
  fake.hook = undefined;
  assert.ok(Date.now() - start >= 120, `retried after ${Date.now() - start} ms`);
  assert.ok(c.connects > connects, "no reconnect");
  const rs = reads("r-5");
  assert.deepEqual(rs.map((r) => r.seq), [4, 4, 4]);
  assert.equal(rs[0]!.id, rs[1]!.id, "resent after the reconnect with the same request id");
  assert.equal(c.readSeq("r-5"), 4);
  assert.equal(fake.markers.get("r-5"), 4);
});

test("a final rejection of a read rejects its markRead; later reads still go out", async () => {
  fake.append("r-6", { kind: "message", body: "x" });
  const c = await connect();
  await assert.rejects(c.markRead("r-6", 5), (err: unknown) => err instanceof ChatpipeError && err.code === "bad_request" && err.op === "read");
  await assert.rejects(c.markRead("r-none", 1), (err: unknown) => err instanceof ChatpipeError && err.code === "forbidden");
  await assert.rejects(c.markRead("r-6", 0), (err: unknown) => err instanceof ChatpipeError && err.code === "bad_request");
  assert.equal(await c.markRead("r-6", 1), 1);
  assert.equal(c.readSeq("r-6"), 1);
});

test("pause stays disconnected with calls waiting; resume dials at once and sends them, same ids", async () => {
  const c = await connect({ baseBackoffMs: 5_000, maxBackoffMs: 5_000 });
  await c.waitSynced();
  const events: string[] = [];
  for (const type of ["connect", "disconnect", "reconnecting"]) c.addEventListener(type, () => events.push(type));
  c.pause();
  assert.equal(c.paused, true);
  assert.equal(c.connected, false);
  const before = fake.requests.length;
  const sending = c.send("p-1", "while paused");
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(fake.requests.length, before, "a request went out while paused");
  assert.equal(c.connects, 1);
  const start = Date.now();
  c.resume();
  const a = await sending;
  assert.ok(Date.now() - start < 2_000, `resume waited ${Date.now() - start} ms: the backoff was not skipped`);
  assert.equal(a.seq, 1);
  assert.equal(c.connects, 2);
  assert.deepEqual(events.slice(0, 2), ["disconnect", "connect"]);
  assert.equal(fake.stored("p-1").length, 1);
  // A lost connection after that waits the backoff and says so.
  const d = await connect({ baseBackoffMs: 20 });
  await d.waitSynced();
  const waits: number[] = [];
  d.addEventListener("reconnecting", (ev) => waits.push((ev as unknown as { detail: { waitMs: number } }).detail.waitMs));
  fake.cutAll();
  await waitUntil("d to reconnect", () => d.connects === 2);
  assert.ok(waits.length >= 1 && waits[0]! <= 20, `waits ${waits}`);
});

test("unread counts other senders' messages after the marker within the current membership", async () => {
  fake.append("r-7", { kind: "create", members: ["u1", "me"] });
  fake.append("r-7", { kind: "message", body: "a" });
  fake.append("r-7", { kind: "message", body: "mine", sender: "me" });
  fake.append("r-7", { kind: "kick", user_id: "me" });
  const c = await connect();
  await c.waitSynced();
  assert.equal(c.unread("r-7", "me"), 0, "a removed user has nothing unread");
  assert.equal(c.unread("r-7", "u1"), 1, "the other member has the message of me unread");
  fake.append("r-7", { kind: "join", user_id: "me" });
  for (const b of ["b", "c", "d"]) fake.append("r-7", { kind: "message", body: b });
  fake.append("r-7", { kind: "message", body: "mine again", sender: "me" });
  await c.sync();
  assert.equal(c.unread("r-7", "me"), 3, "only what came after the join counts");
  assert.equal(await c.markRead("r-7", 7), 7);
  assert.equal(c.unread("r-7", "me"), 1);
  assert.equal(c.unread("r-none", "me"), 0);
});

/** An unsigned JWT-shaped token for user that expires in ms (the fake does not verify). */
function jwtLike(user: string, ms: number): string {
  const b64 = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${b64({ alg: "HS256", typ: "JWT" })}.${b64({ sub: user, exp: (Date.now() + ms) / 1000 })}.sig`;
}

test("the connection's token is refreshed before it expires, on the same connection", async () => {
  let n = 0;
  const c = await Client.connect(fake.url, () => jwtLike(`u-${++n}`, 1200), { WebSocket: WS, baseBackoffMs: 20 });
  clients.push(c);
  await c.waitSynced();
  // Halfway through each token's 1.2 s life: a refresh with the next token.
  await waitUntil("two refreshes", () => c.refreshes >= 2, 5000);
  const refreshed = fake.requests.filter((r) => r.op === "refresh").map((r) => r.token as string);
  assert.ok(refreshed.length >= 2, `refreshes sent: ${refreshed.length}`);
  // The provider's 1st token dialled; its 2nd and 3rd came as refreshes.
  const sub = (tok: string) => JSON.parse(Buffer.from(tok.split(".")[1]!, "base64url").toString()).sub;
  assert.deepEqual(refreshed.slice(0, 2).map(sub), ["u-2", "u-3"]);
  assert.equal(c.connects, 1, "a refresh needs no new connection");
});

test("a token without exp is never refreshed", async () => {
  const before = fake.requests.filter((r) => r.op === "refresh").length;
  const c = await connect();
  await c.waitSynced();
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(fake.requests.filter((r) => r.op === "refresh").length, before);
  await c.close();
});

