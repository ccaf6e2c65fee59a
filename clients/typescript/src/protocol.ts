// Types of the chatpipe websocket protocol v1 (docs/protocol.md) as the
// client exposes them: the wire's snake_case fields in camelCase.

/** The subprotocol under which the server batches frames, `\n`-separated. */
export const SUBPROTOCOL_BATCH = "chatpipe.v1.batch";

/** `rejected.code` values (docs/protocol.md). */
export type Code =
  | "bad_request"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "conflict"
  | "too_large"
  | "rate_limited"
  | "unavailable";

/**
 * `event.kind` values. `moved` is a system event (empty `sender`): the
 * conversation moved to another shard writer; it takes a seq like any
 * event and changes nothing for members.
 */
export type Kind = "create" | "join" | "kick" | "leave" | "message" | "moved";

/** An event of a conversation as the server sends it. */
export interface ChatEvent {
  conversationId: string;
  seq: number;
  kind: Kind | string;
  messageId: string;
  /** For messages: the sender's idempotency key. */
  clientMessageId?: string;
  sender: string;
  /** For messages. */
  body?: string;
  /** For join, kick and leave. */
  userId?: string;
  /** For create. */
  members?: string[];
  /** RFC 3339 in UTC; for display only. */
  createdAt: string;
}

/** The `accepted` answer of a write: its seq and message_id are final. */
export interface Accepted {
  conversationId: string;
  seq: number;
  messageId: string;
  clientMessageId?: string;
}

/** One entry of the `conversations` answer. */
export interface ConversationInfo {
  conversationId: string;
  lastSeq: number;
  lastActivityAt: string;
  /** The user's read marker of the conversation (0: none yet, or a server without read markers). */
  readSeq: number;
  /**
   * The server's count of `message` events of other senders after the
   * marker, within the user's current membership, up to lastSeq.
   */
  unread: number;
}

/** A read marker: the user has read the conversation up to seq. */
export interface ReadMarker {
  conversationId: string;
  seq: number;
}

/** Cursors: for each conversation, the last seq seen. */
export type Cursors = Record<string, number>;

/** A request frame (client → server), wire field names. */
export interface WireRequest {
  op: string;
  id?: string;
  conversation_id?: string;
  client_message_id?: string;
  body?: string;
  members?: string[];
  user_id?: string;
  cursors?: Cursors;
  before_seq?: number;
  limit?: number;
  /** read's marker. */
  seq?: number;
  /** refresh's new token. */
  token?: string;
}

/** An event as it is on the wire. */
export interface WireEvent {
  op?: string;
  conversation_id: string;
  seq: number;
  kind: string;
  message_id: string;
  client_message_id?: string;
  sender: string;
  body?: string;
  user_id?: string;
  members?: string[];
  created_at: string;
}

/** Any server frame (the union of their fields). */
export interface WireFrame extends Partial<WireEvent> {
  op: string;
  id?: string;
  code?: string;
  message?: string;
  retry_after_ms?: number;
  cursors?: Cursors;
  more?: boolean;
  events?: WireEvent[];
  conversations?: { conversation_id: string; last_seq: number; last_activity_at: string; read_seq?: number; unread?: number }[];
  /** synced: the user's read markers of the conversations in cursors that have one. */
  read?: Record<string, number>;
}

export function eventFromWire(w: WireEvent): ChatEvent {
  const e: ChatEvent = {
    conversationId: w.conversation_id,
    seq: w.seq,
    kind: w.kind,
    messageId: w.message_id,
    sender: w.sender,
    createdAt: w.created_at,
  };
  if (w.client_message_id !== undefined) e.clientMessageId = w.client_message_id;
  if (w.body !== undefined) e.body = w.body;
  if (w.user_id !== undefined) e.userId = w.user_id;
  if (w.members !== undefined) e.members = [...w.members];
  return e;
}

/** A command the server rejected, or a client-side failure. */
export class ChatpipeError extends Error {
  /** The server's rejected.code, or "timeout" / "closed" / "protocol". */
  readonly code: Code | "timeout" | "closed" | "protocol";
  /** The op of the command. */
  readonly op: string;
  readonly conversationId?: string;
  /** For rate_limited and unavailable. */
  readonly retryAfterMs?: number;

  constructor(code: ChatpipeError["code"], op: string, message: string, conversationId?: string, retryAfterMs?: number) {
    super(`chatpipe: ${op}${conversationId ? " " + conversationId : ""}: ${code}: ${message}`);
    this.name = "ChatpipeError";
    this.code = code;
    this.op = op;
    if (conversationId !== undefined) this.conversationId = conversationId;
    if (retryAfterMs !== undefined) this.retryAfterMs = retryAfterMs;
  }
}
