// Tests of the client against a small in-process fake of the gateway (no
// chatpipe stack needed): retries, resends after a reconnect, the view's
// de-duplication and order, sync paging and batched frames.

import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import WebSocket, { WebSocketServer } from "ws";

import { backoff, type ChatEvent, ChatpipeError, Client } from "../src/index.js";

const WS = WebSocket; // the `ws` package fits the client's WebSocketConstructor as it is

type Req = Record<string, any>;

/**
 * A fake gateway: one conversation store with dedupe by client_message_id,
 * sync paged by pageSize, history, and a hook that can answer a request
 * itself ("drop" closes the connection unanswered, "ignore" leaves it
 * unanswered, an object is sent as the answer).
 */
class Fake {
  readonly wss: WebSocketServer;
  readonly requests: Req[] = [];
  readonly tokens: string[] = [];
  readonly protocols: string[] = [];
  hook: ((r: Req, ws: WebSocket) => "drop" | "ignore" | object | undefined) | undefined;
  batchPushes = false;
  syncPage = 500;
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

  private onRequest(ws: WebSocket, r: Req): void {
    this.requests.push(r);
    const h = this.hook?.(r, ws);
    if (h === "drop") return void ws.terminate();
    if (h === "ignore") return;
    if (h) return void ws.send(JSON.stringify({ id: r.id, ...h }));
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
        return reply(more ? { op: "synced", cursors, more: true } : { op: "synced", cursors });
      }
      case "history": {
        const list = this.stored(r.conversation_id);
        const before = r.before_seq || Infinity;
        const limit = r.limit || 50;
        const evs = list.filter((e) => e.seq < before).slice(-limit);
        return reply({ op: "history", conversation_id: r.conversation_id, events: evs });
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
