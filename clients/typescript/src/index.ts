export {
  backoff,
  Client,
  ClientEvent,
  randomId,
  type CallOptions,
  type ClientOptions,
  type TokenProvider,
  type WebSocketConstructor,
  type WebSocketLike,
} from "./client.js";
export {
  ChatpipeError,
  SUBPROTOCOL_BATCH,
  type Accepted,
  type ChatEvent,
  type Code,
  type ConversationInfo,
  type Cursors,
  type Kind,
  type ReadMarker,
} from "./protocol.js";
