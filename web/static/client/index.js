export { backoff, Client, ClientEvent, randomId, } from "./client.js";
export { ChatpipeError, SUBPROTOCOL_BATCH, } from "./protocol.js";
