// A client of the chatpipe websocket protocol (docs/protocol.md) that
// follows the contract's rules for client authors, like the Go client
// (client/client.go):
//
//   - every write carries a client_message_id chosen once and kept across
//     retries and reconnects, so a retried command takes effect once;
//   - a lost connection is dialled again with full-jitter exponential
//     backoff, and every command that had no answer is sent again with the
//     same ids;
//   - after each (re)connect the client syncs from the cursors of its last
//     complete `synced` reply, paging while the server says `more`;
//   - `unavailable`, `rate_limited` and unanswered commands are retried,
//     honouring `retry_after_ms`; before the connection's token expires the
//     client sends `refresh` with a fresh token from its provider, and
//     `unauthorized` (a token that expired on an open connection anyway)
//     makes it dial again with a fresh token and retry;
//   - events are de-duplicated by (conversation_id, seq) and kept ordered by
//     seq per conversation;
//   - read markers are coalesced: at most one `read` in flight per
//     conversation, then the highest seq asked for meanwhile; the user's
//     marker of a conversation is the maximum of what the server accepted,
//     pushed (`read` frames, from any of the user's devices) and returned in
//     `synced.read` and `conversations`, so it never moves back.
//
// It has no runtime dependency: it uses the WebSocket implementation it is
// given (options.WebSocket) or the global one (browsers, Node 22+).
import { ChatpipeError, eventFromWire, SUBPROTOCOL_BATCH, } from "./protocol.js";
/**
 * The events a Client dispatches:
 *  - "event": detail is a ChatEvent new to the view;
 *  - "connect": detail is { connects } after each (re)connect;
 *  - "disconnect": detail is { code, reason } when a connection is lost;
 *  - "reconnecting": detail is { attempt, waitMs } before each wait of the
 *    reconnect backoff;
 *  - "synced": detail is the cursors after a sync paged to its end;
 *  - "read": detail is a ReadMarker when the user's marker of a
 *    conversation moves forward (from this device's `read` or another's).
 */
export class ClientEvent extends Event {
    detail;
    constructor(type, detail) {
        super(type);
        this.detail = detail;
    }
}
/**
 * The full-jitter wait before reconnect attempt n:
 * random(0, min(maxMs, baseMs × 2^n)), in milliseconds.
 */
export function backoff(n, baseMs, maxMs, random = Math.random) {
    let ceiling = baseMs;
    for (let i = 0; i < n && ceiling < maxMs; i++)
        ceiling *= 2;
    ceiling = Math.min(ceiling, maxMs);
    if (ceiling <= 0)
        return 0;
    return Math.floor(random() * (ceiling + 1));
}
/** A fresh client_message_id: "m-" and 16 random bytes in hex. */
export function randomId() {
    const b = new Uint8Array(16);
    const c = globalThis.crypto;
    if (c?.getRandomValues)
        c.getRandomValues(b);
    else
        for (let i = 0; i < b.length; i++)
            b[i] = Math.floor(Math.random() * 256);
    let s = "m-";
    for (const x of b)
        s += x.toString(16).padStart(2, "0");
    return s;
}
const OPEN = 1;
function closedError(op) {
    return new ChatpipeError("closed", op, "the client is closed");
}
function isTimeout(err) {
    return err instanceof ChatpipeError && err.code === "timeout";
}
function abortReason(signal) {
    return signal.reason ?? new Error("aborted");
}
/**
 * One device of a user: a websocket kept open until close(), and the
 * ordered, de-duplicated view of the events it has seen.
 */
export class Client extends EventTarget {
    url;
    token;
    WS;
    opts;
    closed = false;
    closing = new AbortController(); // aborted by close()
    ws = null; // null while disconnected
    connAbort = null; // aborted when the connection is lost
    gen = 0; // connection generation, bumped on each connect
    connectedAt = 0;
    dialToken = ""; // the token the connection being dialled or served presented
    refreshTimer;
    refreshCount = 0;
    attempt = 0; // reconnect attempt, reset after a stable connection
    pausedNow = false; // pause(): stay disconnected until resume()
    reconnecting = false; // the reconnect loop runs
    wake = null; // ends the reconnect loop's wait
    nextId = 0;
    pending = new Map();
    cursorsSynced = {}; // of the last complete synced reply only
    view = new Map();
    syncedNow = false; // the current connection's sync paged to its end
    syncWaiters = new Set();
    connectCount = 0;
    markers = new Map(); // the user's read marker per conversation
    readOut = new Map();
    constructor(url, token, options) {
        super();
        this.url = url;
        this.token = typeof token === "string" ? () => token : token;
        const WS = options.WebSocket ?? globalThis.WebSocket;
        if (!WS) {
            throw new TypeError("chatpipe: no WebSocket implementation: pass options.WebSocket (e.g. the `ws` package on Node 20)");
        }
        this.WS = WS;
        this.opts = {
            batch: options.batch ?? false,
            requestTimeoutMs: options.requestTimeoutMs ?? 20_000,
            baseBackoffMs: options.baseBackoffMs ?? 250,
            maxBackoffMs: options.maxBackoffMs ?? 30_000,
            stableAfterMs: options.stableAfterMs ?? 60_000,
            dialTimeoutMs: options.dialTimeoutMs ?? 10_000,
            refreshBeforeMs: options.refreshBeforeMs ?? 60_000,
            newId: options.newId ?? randomId,
            onEvent: options.onEvent,
            onRead: options.onRead,
            onFrame: options.onFrame,
        };
        for (const [k, v] of Object.entries(options.cursors ?? {}))
            this.cursorsSynced[k] = v;
    }
    /**
     * Connects to the gateway at url (ws:// or wss://, e.g.
     * ws://127.0.0.1:8080/v1/ws) as the user of token. The first dial must
     * succeed; later connection losses are dialled again in the background
     * until close(). The first sync runs in the background too: see
     * waitSynced().
     */
    static async connect(url, token, options = {}) {
        const c = new Client(url, token, options);
        const ws = await c.dial();
        c.serve(ws);
        return c;
    }
    /** How many connections the client has opened so far. */
    get connects() {
        return this.connectCount;
    }
    /** Whether a connection is open now. */
    get connected() {
        return this.ws !== null;
    }
    /** Whether pause() holds the client disconnected. */
    get paused() {
        return this.pausedNow;
    }
    /**
     * Closes the connection (code 4000) and stays disconnected until
     * resume(): an app's "offline" switch. Calls made or left unanswered
     * meanwhile wait, and go out again, with the same ids, once resumed.
     */
    pause() {
        if (this.closed || this.pausedNow)
            return;
        this.pausedNow = true;
        this.wake?.abort();
        const ws = this.ws;
        if (ws) {
            ws.onopen = ws.onclose = ws.onerror = ws.onmessage = null;
            try {
                ws.close(4000, "paused");
            }
            catch {
                // already closed
            }
            this.lost(ws, 4000, "paused");
        }
    }
    /** Ends a pause(): dials at once, then as after any lost connection. */
    resume() {
        if (this.closed || !this.pausedNow)
            return;
        this.pausedNow = false;
        this.attempt = 0;
        if (this.reconnecting)
            this.wake?.abort();
        else if (!this.ws)
            void this.reconnect(true);
    }
    /** The cursors of the last complete sync: for each conversation, the last seq the client is sure to have seen. */
    cursors() {
        return { ...this.cursorsSynced };
    }
    /** The events of a conversation the client has seen (pushed, synced or fetched with history), each once, in ascending seq. */
    messages(conversationId) {
        const m = this.view.get(conversationId);
        if (!m)
            return [];
        return [...m.values()].sort((a, b) => a.seq - b.seq).map((e) => ({ ...e }));
    }
    /** The ids of the conversations in the client's view, sorted. */
    conversationIds() {
        return [...this.view.keys()].sort();
    }
    /** Resolves once the sync that follows the current connection has paged to its end. */
    waitSynced(options = {}) {
        if (this.closed)
            return Promise.reject(closedError("sync"));
        if (this.syncedNow)
            return Promise.resolve();
        return new Promise((resolve, reject) => {
            const signal = options.signal;
            const onAbort = () => {
                this.syncWaiters.delete(w);
                reject(abortReason(signal));
            };
            const w = {
                resolve: () => {
                    signal?.removeEventListener("abort", onAbort);
                    resolve();
                },
                reject: (err) => {
                    signal?.removeEventListener("abort", onAbort);
                    reject(err);
                },
            };
            if (signal?.aborted)
                return reject(abortReason(signal));
            signal?.addEventListener("abort", onAbort, { once: true });
            this.syncWaiters.add(w);
        });
    }
    /**
     * Ends the connection and stops reconnecting. Calls in flight reject with
     * a ChatpipeError of code "closed".
     */
    async close() {
        if (this.closed)
            return;
        this.closed = true;
        clearTimeout(this.refreshTimer);
        this.closing.abort(closedError("close"));
        const ws = this.ws;
        if (ws)
            this.drop(ws, 1000);
        for (const cl of [...this.pending.values()])
            cl.reject(closedError(cl.req.op));
        for (const w of [...this.syncWaiters])
            w.reject(closedError("sync"));
        this.syncWaiters.clear();
        for (const st of this.readOut.values())
            for (const w of st.waiters.splice(0))
                w.reject(closedError("read"));
    }
    // --- writes
    /**
     * Posts body to a conversation and resolves with its accepted answer (seq
     * and message_id are final). It retries until the signal ends it, always
     * with the same client_message_id, so the message is stored at most once.
     */
    send(conversationId, body, options = {}) {
        return this.sendWithId(conversationId, this.opts.newId(), body, options);
    }
    /**
     * send with a client_message_id chosen by the caller (an app that keeps
     * unsent messages across restarts passes the stored id again).
     */
    sendWithId(conversationId, clientMessageId, body, options = {}) {
        return this.writeCmd({ op: "send", conversation_id: conversationId, client_message_id: clientMessageId, body }, options.signal);
    }
    /**
     * Creates a conversation with members (the caller is added and becomes the
     * owner). A retry that finds it created by this call answers accepted.
     */
    create(conversationId, members = [], options = {}) {
        return this.writeCmd({ op: "create", conversation_id: conversationId, members, client_message_id: this.opts.newId() }, options.signal);
    }
    /** Adds a user to a conversation. */
    join(conversationId, userId, options = {}) {
        return this.writeCmd({ op: "join", conversation_id: conversationId, user_id: userId, client_message_id: this.opts.newId() }, options.signal);
    }
    /** Removes a user from a conversation (the owner only). */
    kick(conversationId, userId, options = {}) {
        return this.writeCmd({ op: "kick", conversation_id: conversationId, user_id: userId, client_message_id: this.opts.newId() }, options.signal);
    }
    /** Removes the caller from a conversation. */
    leave(conversationId, options = {}) {
        return this.writeCmd({ op: "leave", conversation_id: conversationId, client_message_id: this.opts.newId() }, options.signal);
    }
    // --- read markers
    /**
     * Records that the user has read a conversation up to seq (at most its
     * last seq). Calls are coalesced: at most one `read` is in flight per
     * conversation; when it is answered the highest seq asked for meanwhile
     * goes out, and a seq at or below the marker sends nothing. The read is
     * sent again after a reconnect and retried on unavailable and
     * rate_limited after retry_after_ms. Resolves with the marker once it is
     * at least seq (a pushed `read` frame of another device may get there
     * first); rejects with the ChatpipeError of a final rejection (forbidden:
     * not a member; bad_request: seq past the conversation's last seq).
     */
    markRead(conversationId, seq, options = {}) {
        if (this.closed)
            return Promise.reject(closedError("read"));
        if (!Number.isSafeInteger(seq) || seq < 1) {
            return Promise.reject(new ChatpipeError("bad_request", "read", `seq must be an integer of at least 1, not ${seq}`, conversationId));
        }
        const marker = this.readSeq(conversationId);
        if (seq <= marker)
            return Promise.resolve(marker);
        let st = this.readOut.get(conversationId);
        if (!st) {
            st = { want: 0, inFlight: 0, waiters: [] };
            this.readOut.set(conversationId, st);
        }
        st.want = Math.max(st.want, seq);
        const out = st;
        const p = new Promise((resolve, reject) => {
            const signal = options.signal;
            if (signal?.aborted)
                return reject(abortReason(signal));
            const onAbort = () => {
                const i = out.waiters.indexOf(w);
                if (i >= 0)
                    out.waiters.splice(i, 1);
                reject(abortReason(signal));
            };
            const w = {
                seq,
                resolve: (m) => {
                    signal?.removeEventListener("abort", onAbort);
                    resolve(m);
                },
                reject: (err) => {
                    signal?.removeEventListener("abort", onAbort);
                    reject(err);
                },
            };
            signal?.addEventListener("abort", onAbort, { once: true });
            out.waiters.push(w);
        });
        if (!st.inFlight)
            void this.pumpRead(conversationId, st);
        return p;
    }
    /**
     * The user's read marker of a conversation as this client knows it: the
     * maximum of the reads the server accepted, the `read` frames it pushed,
     * `synced.read` and the `conversations` answer's read_seq (0: none).
     */
    readSeq(conversationId) {
        return this.markers.get(conversationId) ?? 0;
    }
    /** Every read marker the client knows, by conversation. */
    readMarkers() {
        return Object.fromEntries(this.markers);
    }
    /**
     * The number of unread messages of a conversation in the client's view,
     * counted as the server counts `unread`: `message` events of other
     * senders than userId (the user of the token) after the read marker,
     * within userId's current membership (0 once they were removed). It is
     * exact when the view holds the conversation's events after the marker,
     * as it does after a sync from empty cursors.
     */
    unread(conversationId, userId) {
        const m = this.view.get(conversationId);
        if (!m)
            return 0;
        const evs = [...m.values()].sort((a, b) => a.seq - b.seq);
        let from = 0; // the user's membership starts after this seq
        let member = true;
        for (const e of evs) {
            if (e.kind === "create" && (e.sender === userId || (e.members ?? []).includes(userId))) {
                member = true;
                from = e.seq;
            }
            else if (e.kind === "join" && e.userId === userId) {
                member = true;
                from = e.seq;
            }
            else if ((e.kind === "kick" || e.kind === "leave") && (e.userId || e.sender) === userId) {
                member = false;
            }
        }
        if (!member)
            return 0;
        const after = Math.max(from, this.readSeq(conversationId));
        let n = 0;
        for (const e of evs)
            if (e.seq > after && e.kind === "message" && e.sender !== userId)
                n++;
        return n;
    }
    /** Sends the conversation's reads, one at a time, until the marker is at the highest seq asked for. */
    async pumpRead(conversationId, st) {
        while (!this.closed && st.want > this.readSeq(conversationId)) {
            const seq = st.want;
            st.inFlight = seq;
            try {
                const a = await this.writeCmd({ op: "read", conversation_id: conversationId, seq });
                this.advance(conversationId, Math.max(seq, a.seq));
            }
            catch (err) {
                // A final rejection ends the reads asked for up to seq; a higher
                // one asked for meanwhile still goes out.
                const still = [];
                for (const w of st.waiters) {
                    if (w.seq <= seq || this.closed)
                        w.reject(err);
                    else
                        still.push(w);
                }
                st.waiters = still;
                if (st.want <= seq)
                    st.want = this.readSeq(conversationId);
            }
            finally {
                st.inFlight = 0;
            }
        }
        if (st.waiters.length === 0 && this.readOut.get(conversationId) === st)
            this.readOut.delete(conversationId);
    }
    /** Moves the user's marker of a conversation forward to seq (never back) and tells the app. */
    advance(conversationId, seq) {
        if (!conversationId || typeof seq !== "number" || !Number.isFinite(seq))
            return;
        const old = this.markers.get(conversationId) ?? 0;
        if (seq <= old)
            return;
        this.markers.set(conversationId, seq);
        const st = this.readOut.get(conversationId);
        if (st) {
            const still = [];
            for (const w of st.waiters) {
                if (w.seq <= seq)
                    w.resolve(seq);
                else
                    still.push(w);
            }
            st.waiters = still;
        }
        const m = { conversationId, seq };
        try {
            this.opts.onRead?.({ ...m });
            this.dispatchEvent(new ClientEvent("read", { ...m }));
        }
        catch (err) {
            queueMicrotask(() => {
                throw err;
            });
        }
    }
    // --- reads
    /**
     * Asks for every event after the cursors of the last complete sync, paging
     * while the server answers more, and records them (new ones are delivered
     * as events). The client syncs by itself after every (re)connect; call
     * sync to catch up at another moment.
     */
    sync(options = {}) {
        return this.syncAll(options.signal);
    }
    /**
     * One page of a conversation's events before beforeSeq (absent or 0: the
     * newest), at most limit (absent: the server's default, 50), in ascending
     * seq. A page shorter than limit means nothing older is left. The events
     * are added to the view but not delivered as events.
     */
    async history(conversationId, options = {}) {
        const req = { op: "history", conversation_id: conversationId };
        if (options.beforeSeq)
            req.before_seq = options.beforeSeq;
        if (options.limit)
            req.limit = options.limit;
        const f = await this.read(req, options.signal);
        if (f.op !== "history")
            throw new ChatpipeError("protocol", "history", `answered with ${JSON.stringify(f.op)}`, conversationId);
        const evs = f.events ?? [];
        this.record(evs, false);
        return evs.map(eventFromWire);
    }
    /**
     * Pages history backwards from the newest event with pages of pageSize
     * (default 50) and returns everything the caller may see of the
     * conversation, in ascending seq.
     */
    async historyAll(conversationId, options = {}) {
        const pageSize = options.pageSize && options.pageSize > 0 ? options.pageSize : 50;
        const pages = [];
        let before = 0;
        for (;;) {
            const p = await this.history(conversationId, { beforeSeq: before, limit: pageSize, signal: options.signal });
            pages.push(p);
            if (p.length < pageSize || p[0].seq <= 1)
                break;
            before = p[0].seq;
        }
        return pages.reverse().flat();
    }
    /** The caller's current conversations, most recently active first, at most limit (absent: the server's default). */
    async listConversations(options = {}) {
        const req = { op: "conversations" };
        if (options.limit)
            req.limit = options.limit;
        const f = await this.read(req, options.signal);
        if (f.op !== "conversations")
            throw new ChatpipeError("protocol", "conversations", `answered with ${JSON.stringify(f.op)}`);
        const list = (f.conversations ?? []).map((c) => ({
            conversationId: c.conversation_id,
            lastSeq: c.last_seq,
            lastActivityAt: c.last_activity_at,
            readSeq: c.read_seq ?? 0,
            unread: c.unread ?? 0,
        }));
        for (const c of list)
            this.advance(c.conversationId, c.readSeq);
        return list;
    }
    // --- connection
    async dial() {
        let tok;
        try {
            tok = await this.token();
        }
        catch (err) {
            throw new Error(`chatpipe: token: ${String(err)}`, { cause: err });
        }
        this.dialToken = tok;
        const u = new URL(this.url);
        u.searchParams.set("token", tok);
        return new Promise((resolve, reject) => {
            let ws;
            try {
                ws = this.opts.batch ? new this.WS(u.toString(), [SUBPROTOCOL_BATCH]) : new this.WS(u.toString());
            }
            catch (err) {
                reject(err);
                return;
            }
            let settled = false;
            const fail = (why) => {
                if (settled)
                    return;
                settled = true;
                clearTimeout(timer);
                this.closing.signal.removeEventListener("abort", onClose);
                ws.onopen = ws.onclose = ws.onmessage = null;
                // Closing a socket still connecting makes the `ws` package emit an
                // error, which it throws when nothing listens.
                ws.onerror = () => { };
                try {
                    ws.close();
                }
                catch {
                    // already closed
                }
                reject(new Error(`chatpipe: dial ${this.url}: ${why}`));
            };
            const timer = setTimeout(() => fail("timeout"), this.opts.dialTimeoutMs);
            const onClose = () => fail("the client is closed");
            this.closing.signal.addEventListener("abort", onClose, { once: true });
            ws.onopen = () => {
                if (settled)
                    return;
                settled = true;
                clearTimeout(timer);
                this.closing.signal.removeEventListener("abort", onClose);
                ws.onclose = ws.onerror = null;
                resolve(ws);
            };
            ws.onerror = (ev) => fail(ev?.message ?? ev?.error?.message ?? "connection error");
            ws.onclose = (ev) => fail(`closed with ${ev?.code ?? "no code"}`);
        });
    }
    /**
     * Takes ws as the current connection: sends again every command that had
     * no answer on an earlier connection and starts the sync.
     */
    serve(ws) {
        if (this.closed) {
            ws.close(1000);
            return;
        }
        this.ws = ws;
        this.gen++;
        this.connectCount++;
        this.connectedAt = Date.now();
        this.syncedNow = false;
        const gen = this.gen;
        const abort = new AbortController();
        this.connAbort = abort;
        ws.onmessage = (ev) => this.onMessage(ev.data);
        ws.onclose = (ev) => this.lost(ws, ev?.code, ev?.reason);
        this.scheduleRefresh(gen, this.dialToken);
        ws.onerror = () => {
            // a close event follows
        };
        // In request-id order, so commands go out again in the order they were
        // first sent.
        const again = [...this.pending.values()]
            .filter((cl) => cl.gen !== gen && cl.resend)
            .sort((a, b) => Number(a.req.id.slice(1)) - Number(b.req.id.slice(1)));
        for (const cl of again) {
            cl.gen = gen;
            this.write(ws, cl.req);
        }
        this.dispatchEvent(new ClientEvent("connect", { connects: this.connectCount }));
        this.syncAll(abort.signal).then(() => {
            if (this.gen !== gen || this.ws !== ws)
                return;
            this.syncedNow = true;
            for (const w of [...this.syncWaiters])
                w.resolve();
            this.syncWaiters.clear();
            this.dispatchEvent(new ClientEvent("synced", this.cursors()));
        }, () => {
            // the connection was lost or the client closed; the next
            // connection syncs again
        });
    }
    /** Drops ws at once (it is no longer read) and handles it as lost. */
    drop(ws, code = 1006) {
        ws.onopen = ws.onclose = ws.onerror = ws.onmessage = null;
        try {
            const t = ws.terminate;
            if (code !== 1000 && typeof t === "function")
                t.call(ws);
            else
                ws.close(code === 1006 ? 1000 : code);
        }
        catch {
            // already closed
        }
        this.lost(ws, code, "");
    }
    /** How many times the connection's token was replaced by `refresh`. */
    get refreshes() {
        return this.refreshCount;
    }
    /**
     * Arms the refresh of connection gen's token tok: refreshBeforeMs before
     * its exp, or halfway through its life if that is later.
     */
    scheduleRefresh(gen, tok) {
        clearTimeout(this.refreshTimer);
        const exp = tokenExpiry(tok);
        const now = Date.now();
        if (exp === undefined || exp <= now || this.closed)
            return;
        const at = Math.max(exp - this.opts.refreshBeforeMs, now + (exp - now) / 2);
        this.refreshTimer = setTimeout(() => void this.refreshNow(gen), at - now);
    }
    /** Replaces connection gen's token with a fresh one from the provider. */
    async refreshNow(gen) {
        if (this.closed || gen !== this.gen || !this.ws)
            return;
        let tok;
        try {
            tok = await this.token();
        }
        catch {
            return; // the provider failed: the fallback (dialling again) remains
        }
        try {
            const f = await this.roundTrip({ op: "refresh", token: tok }, false, this.connAbort?.signal);
            if (f.op === "accepted" && gen === this.gen) {
                this.refreshCount++;
                this.scheduleRefresh(gen, tok);
            }
        }
        catch {
            // the connection went away, or no answer: a new connection dials with a fresh token
        }
    }
    /** Handles the loss of ws: reconnects in the background unless closed. */
    lost(ws, code, reason) {
        if (this.ws !== ws)
            return;
        clearTimeout(this.refreshTimer);
        ws.onopen = ws.onclose = ws.onerror = ws.onmessage = null;
        this.ws = null;
        this.syncedNow = false;
        this.connAbort?.abort(new Error("connection lost"));
        this.connAbort = null;
        this.dispatchEvent(new ClientEvent("disconnect", { code: code ?? 1006, reason: reason ?? "" }));
        if (this.closed || this.pausedNow)
            return;
        if (Date.now() - this.connectedAt >= this.opts.stableAfterMs)
            this.attempt = 0;
        void this.reconnect();
    }
    /**
     * Dials until a connection is served, waiting the full-jitter backoff
     * before each attempt (but the first when now), unless closed or paused.
     */
    async reconnect(now = false) {
        if (this.reconnecting)
            return;
        this.reconnecting = true;
        try {
            for (let first = true; !this.closed && !this.pausedNow; first = false) {
                if (!(now && first)) {
                    const wait = backoff(this.attempt, this.opts.baseBackoffMs, this.opts.maxBackoffMs);
                    this.attempt++;
                    this.dispatchEvent(new ClientEvent("reconnecting", { attempt: this.attempt, waitMs: wait }));
                    const wake = new AbortController();
                    this.wake = wake;
                    await this.sleep(wait, wake.signal); // resume() ends it early
                    this.wake = null;
                    if (this.closed || this.pausedNow)
                        return;
                }
                let ws;
                try {
                    ws = await this.dial();
                }
                catch {
                    continue;
                }
                if (this.pausedNow) {
                    ws.onopen = ws.onclose = ws.onerror = ws.onmessage = null;
                    ws.close(4000, "paused");
                    return;
                }
                this.serve(ws);
                return;
            }
        }
        finally {
            this.reconnecting = false;
        }
    }
    /**
     * Drops the current connection so that the next one is dialled with a
     * token fresh from the provider (the gateway answers unauthorized once
     * the connection's token has expired).
     */
    redial() {
        if (this.ws)
            this.drop(this.ws);
    }
    write(ws, req) {
        if (ws.readyState !== OPEN)
            return; // the loss is noticed; req goes out again on the next connection
        try {
            ws.send(JSON.stringify(req));
        }
        catch {
            // as above
        }
    }
    onMessage(data) {
        let text;
        if (typeof data === "string")
            text = data;
        else if (data instanceof ArrayBuffer)
            text = new TextDecoder().decode(data);
        else if (ArrayBuffer.isView(data))
            text = new TextDecoder().decode(data);
        else
            return;
        for (const part of text.split("\n")) {
            if (part.length > 0)
                this.handle(part);
        }
    }
    /** Dispatches one server frame. */
    handle(raw) {
        if (this.opts.onFrame)
            this.opts.onFrame(raw);
        let f;
        try {
            f = JSON.parse(raw);
        }
        catch {
            return;
        }
        if (f === null || typeof f !== "object")
            return;
        if (f.op === "event") {
            this.record([f], true);
            return;
        }
        if (f.op === "read" && !f.id) {
            // a marker pushed to every device of the user: keep the maximum
            this.advance(f.conversation_id, f.seq);
            return;
        }
        if (!f.id)
            return;
        this.pending.get(f.id)?.resolve(f);
    }
    /** Adds events to the view; those new to it are delivered when emit is set. */
    record(evs, emit) {
        for (const w of evs) {
            let m = this.view.get(w.conversation_id);
            if (!m) {
                m = new Map();
                this.view.set(w.conversation_id, m);
            }
            if (m.has(w.seq))
                continue;
            const e = eventFromWire(w);
            m.set(w.seq, e);
            if (emit)
                this.deliver(e);
        }
    }
    deliver(e) {
        try {
            this.opts.onEvent?.({ ...e });
            this.dispatchEvent(new ClientEvent("event", { ...e }));
        }
        catch (err) {
            // An exception of the app's handler must not stop the frames after
            // this one: report it as uncaught, outside the client's code.
            queueMicrotask(() => {
                throw err;
            });
        }
    }
    // --- requests
    /**
     * Sends req (its id set here) and waits for the answer, at most
     * requestTimeoutMs. With resend, a connection lost before the answer sends
     * req again, same ids, on the next one.
     */
    roundTrip(req, resend, signal) {
        return new Promise((resolve, reject) => {
            if (this.closed)
                return reject(closedError(req.op));
            if (signal?.aborted)
                return reject(abortReason(signal));
            const id = "r" + ++this.nextId;
            const onAbort = () => cl.reject(abortReason(signal));
            const finish = () => {
                this.pending.delete(id);
                clearTimeout(timer);
                signal?.removeEventListener("abort", onAbort);
            };
            const cl = {
                req: { ...req, id },
                gen: 0,
                resend,
                resolve: (f) => {
                    finish();
                    resolve(f);
                },
                reject: (err) => {
                    finish();
                    reject(err);
                },
            };
            const timer = setTimeout(() => cl.reject(new ChatpipeError("timeout", req.op, "no answer in time", req.conversation_id)), this.opts.requestTimeoutMs);
            signal?.addEventListener("abort", onAbort, { once: true });
            this.pending.set(id, cl);
            if (this.ws) {
                cl.gen = this.gen;
                this.write(this.ws, cl.req);
            }
        });
    }
    /** Waits ms; false if the client closed or signal ended first. */
    sleep(ms, signal) {
        return new Promise((resolve) => {
            if (this.closed || signal?.aborted)
                return resolve(false);
            const done = (ok) => {
                clearTimeout(timer);
                this.closing.signal.removeEventListener("abort", onAbort);
                signal?.removeEventListener("abort", onAbort);
                resolve(ok);
            };
            const onAbort = () => done(false);
            const timer = setTimeout(() => done(true), ms);
            this.closing.signal.addEventListener("abort", onAbort, { once: true });
            signal?.addEventListener("abort", onAbort, { once: true });
        });
    }
    /** The wait before retrying an unavailable or rate_limited answer. */
    retryWait(f, attempt) {
        return Math.max(f.retry_after_ms ?? 0, backoff(Math.min(attempt, 4), this.opts.baseBackoffMs, this.opts.maxBackoffMs));
    }
    async waitRetry(f, attempt, op, signal) {
        if (await this.sleep(this.retryWait(f, attempt), signal))
            return;
        if (this.closed)
            throw closedError(op);
        throw abortReason(signal);
    }
    /**
     * The retry loop of every write: the request is sent until it gets an
     * answer other than unavailable or rate_limited, with the same
     * client_message_id each time, waiting retry_after_ms (at least a
     * jittered backoff) between tries.
     */
    async writeCmd(req, signal) {
        let refreshes = 0;
        for (let attempt = 0;; attempt++) {
            let f;
            try {
                f = await this.roundTrip(req, true, signal);
            }
            catch (err) {
                if (isTimeout(err))
                    continue;
                throw err;
            }
            if (f.op === "accepted") {
                const a = { conversationId: f.conversation_id ?? "", seq: f.seq ?? 0, messageId: f.message_id ?? "" };
                if (f.client_message_id !== undefined)
                    a.clientMessageId = f.client_message_id;
                return a;
            }
            if (f.op !== "rejected")
                throw new ChatpipeError("protocol", req.op, `answered with ${JSON.stringify(f.op)}`, req.conversation_id);
            if (f.code === "unauthorized" && refreshes < MAX_REFRESHES) {
                refreshes++;
                this.redial();
                continue;
            }
            if (f.code !== "unavailable" && f.code !== "rate_limited")
                throw rejection(req, f);
            await this.waitRetry(f, attempt, req.op, signal);
        }
    }
    /** Sends a read request (sync, history, conversations) until it gets an answer other than unavailable or rate_limited. */
    async read(req, signal) {
        let refreshes = 0;
        for (let attempt = 0;; attempt++) {
            let f;
            try {
                f = await this.roundTrip(req, true, signal);
            }
            catch (err) {
                if (isTimeout(err))
                    continue;
                throw err;
            }
            if (f.op !== "rejected")
                return f;
            if (f.code === "unauthorized" && refreshes < MAX_REFRESHES) {
                refreshes++;
                this.redial();
                continue;
            }
            if (f.code !== "unavailable" && f.code !== "rate_limited")
                throw rejection(req, f);
            await this.waitRetry(f, attempt, req.op, signal);
        }
    }
    async syncAll(signal) {
        for (;;) {
            const f = await this.read({ op: "sync", cursors: this.cursors() }, signal);
            if (f.op !== "synced")
                throw new ChatpipeError("protocol", "sync", `answered with ${JSON.stringify(f.op)}`);
            // The sync's event frames came before synced, on the same connection:
            // everything up to these cursors is in the view.
            for (const [k, v] of Object.entries(f.cursors ?? {})) {
                if (v > (this.cursorsSynced[k] ?? 0))
                    this.cursorsSynced[k] = v;
            }
            for (const [k, v] of Object.entries(f.read ?? {}))
                this.advance(k, v);
            if (!f.more)
                return;
        }
    }
}
/** How many times one command answered unauthorized makes the client dial again with a fresh token before it gives up. */
const MAX_REFRESHES = 2;
function rejection(req, f) {
    return new ChatpipeError((f.code ?? "protocol"), req.op, f.message ?? "", req.conversation_id, f.retry_after_ms);
}
/**
 * The exp of a JWT in milliseconds since the epoch, read without verifying
 * the token (undefined when it has none or is not a JWT).
 */
function tokenExpiry(tok) {
    const part = tok.split(".")[1];
    if (!part)
        return undefined;
    try {
        const json = atob(part.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(part.length / 4) * 4, "="));
        const exp = JSON.parse(json).exp;
        return typeof exp === "number" && Number.isFinite(exp) ? exp * 1000 : undefined;
    }
    catch {
        return undefined;
    }
}
