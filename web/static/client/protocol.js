// Types of the chatpipe websocket protocol v1 (docs/protocol.md) as the
// client exposes them: the wire's snake_case fields in camelCase.
/** The subprotocol under which the server batches frames, `\n`-separated. */
export const SUBPROTOCOL_BATCH = "chatpipe.v1.batch";
export function eventFromWire(w) {
    const e = {
        conversationId: w.conversation_id,
        seq: w.seq,
        kind: w.kind,
        messageId: w.message_id,
        sender: w.sender,
        createdAt: w.created_at,
    };
    if (w.client_message_id !== undefined)
        e.clientMessageId = w.client_message_id;
    if (w.body !== undefined)
        e.body = w.body;
    if (w.user_id !== undefined)
        e.userId = w.user_id;
    if (w.members !== undefined)
        e.members = [...w.members];
    return e;
}
/** A command the server rejected, or a client-side failure. */
export class ChatpipeError extends Error {
    /** The server's rejected.code, or "timeout" / "closed" / "protocol". */
    code;
    /** The op of the command. */
    op;
    conversationId;
    /** For rate_limited and unavailable. */
    retryAfterMs;
    constructor(code, op, message, conversationId, retryAfterMs) {
        super(`chatpipe: ${op}${conversationId ? " " + conversationId : ""}: ${code}: ${message}`);
        this.name = "ChatpipeError";
        this.code = code;
        this.op = op;
        if (conversationId !== undefined)
            this.conversationId = conversationId;
        if (retryAfterMs !== undefined)
            this.retryAfterMs = retryAfterMs;
    }
}
