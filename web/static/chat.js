// chatpipe chat page: the DOM over the TypeScript client of the public
// websocket protocol (clients/typescript, compiled into /web/client/ and
// committed, so there is no build step at serve time). The client does the
// protocol: it reconnects with full jitter, sends unanswered commands again
// with the same ids, syncs (paging while `more`), drops duplicate events by
// (conversation_id, seq), retries unavailable and rate_limited, and keeps
// the user's read markers. This file draws its view and turns clicks into
// its calls. No framework; every piece of user data reaches the DOM through
// textContent.

import {backoff, Client, randomId} from './client/index.js';

const $ = (sel) => document.querySelector(sel);

// h builds an element: h('li', {class: 'x', 'data-seq': 3}, 'text', child…).
function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'onclick') e.addEventListener('click', v);
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const k of kids) {
    if (k === undefined || k === null) continue;
    e.append(typeof k === 'string' || typeof k === 'number' ? String(k) : k);
  }
  return e;
}

const S = {
  dev: false,
  user: '',
  client: null, // the Client of the current user, once its first dial worked
  run: 0, // bumped by start() and stop(): callbacks of an earlier client are ignored
  // What the page adds to the client's view, per conversation.
  convs: new Map(),
  selected: null,
};

// conv returns the page's state of a conversation, made on first use.
function conv(id) {
  let c = S.convs.get(id);
  if (!c) {
    c = {
      id,
      mine: new Map(), // client_message_id → {body, seq, messageId, status} of sends from this page
      created: null, // {members} of a create from this page, until its event arrives
      lastSeq: 0, // from the conversations answer
      asked: 0, // the highest seq markRead was asked for
    };
    S.convs.set(id, c);
  }
  return c;
}

// ---- protocol log ----
const logLines = [];
function log(dir, text) {
  const t = new Date().toISOString().slice(11, 23);
  logLines.push(`${t} ${dir} ${text}`);
  if (logLines.length > 300) logLines.splice(0, logLines.length - 300);
  $('#log').textContent = logLines.join('\n');
}

function note(text) {
  $('#note').textContent = text || '';
}

function setStatus(state, text) {
  const s = $('#status');
  s.dataset.state = state;
  s.textContent = text;
}

// failure describes a call that failed: a ChatpipeError's message names
// the op, the conversation, the code and the server's message.
function failure(what, err) {
  const msg = String((err && err.message) || err);
  return err && err.code ? msg.replace(/^chatpipe: /, '') : `${what}: ${msg}`;
}

// ---- connection ----

// LoggedWebSocket is the browser's WebSocket writing what it sends, its
// opening and its closing to the protocol log (the client's onFrame logs
// what arrives).
class LoggedWebSocket extends WebSocket {
  constructor(url, protocols) {
    if (protocols === undefined) super(url);
    else super(url, protocols);
    this.addEventListener('open', () => log('··', 'open'));
    this.addEventListener('close', (e) => log('··', `closed ${e.code}${e.reason ? ' ' + e.reason : ''}`));
  }

  send(data) {
    log('→', data);
    super.send(data);
  }
}

function wsURL() {
  const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
  return `${scheme}${location.host}/v1/ws`;
}

async function devToken(user) {
  const r = await fetch('/dev/token', {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({user}),
  });
  const j = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(j.error || `dev token: HTTP ${r.status}`);
  return j.token;
}

// tokenFor is the client's token provider, asked at every (re)connect: in
// dev a fresh token each time, so an expired one never blocks a reconnect.
function tokenFor(user) {
  return async () => {
    if (S.dev) return devToken(user);
    const t = $('#token').value.trim();
    if (!t) throw new Error('paste a token first (chatpipe token --user …)');
    return t;
  };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// start connects as user. Until the first dial works it dials again itself,
// with the client's full-jitter backoff; after that the client reconnects.
async function start(user) {
  stop();
  const run = S.run;
  S.user = user;
  S.convs.clear();
  S.selected = null;
  note('');
  render();
  const u = new URL(location.href);
  u.searchParams.set('user', user);
  history.replaceState(null, '', u);
  localStorage.setItem('chatpipe.user', user);
  for (let attempt = 0; run === S.run; attempt++) {
    if ($('#offline').checked) {
      setStatus('offline', `offline (${user})`);
      attempt = -1;
      await sleep(200);
      continue;
    }
    setStatus('connecting', `connecting as ${user}…`);
    let c;
    try {
      c = await Client.connect(wsURL(), tokenFor(user), {
        WebSocket: LoggedWebSocket,
        onFrame: (raw) => {
          if (run === S.run) onFrame(raw);
        },
      });
    } catch (err) {
      if (run !== S.run) return;
      const wait = backoff(attempt, 250, 30000);
      setStatus('reconnecting', `${failure('connect', err)}; again in ${wait} ms`);
      await sleep(wait);
      continue;
    }
    if (run !== S.run) {
      c.close();
      return;
    }
    attach(c, run);
    return;
  }
}

function attach(c, run) {
  S.client = c;
  const mine = (f) => (ev) => {
    if (run === S.run) f(ev.detail);
  };
  c.addEventListener('event', mine((e) => {
    conv(e.conversationId);
    if (!S.selected) S.selected = e.conversationId;
    scheduleRender();
  }));
  c.addEventListener('connect', mine(() => setStatus('open', `connected as ${S.user}`)));
  c.addEventListener('disconnect', mine((d) => {
    if (c.paused) setStatus('offline', `offline (${S.user})`);
    else setStatus('reconnecting', `connection lost (closed ${d.code})`);
  }));
  c.addEventListener('reconnecting', mine((d) => setStatus('reconnecting', `reconnecting in ${d.waitMs} ms`)));
  c.addEventListener('read', mine(() => scheduleRender()));
  c.addEventListener('synced', mine(() => {
    scheduleRender();
    // The conversations answer has each one's last seq and the server's
    // read marker (the client keeps the highest it hears of).
    c.listConversations().then((list) => {
      if (run !== S.run) return;
      for (const x of list) conv(x.conversationId).lastSeq = Math.max(conv(x.conversationId).lastSeq, x.lastSeq);
      scheduleRender();
    }, () => {});
  }));
  setStatus('open', `connected as ${S.user}`);
  if ($('#offline').checked) c.pause();
  scheduleRender();
}

function stop() {
  S.run++;
  const c = S.client;
  S.client = null;
  if (c) c.close();
  setStatus('idle', 'not connected');
}

// onFrame logs a frame from the server; one without an id that rejects
// something is shown as a note too.
function onFrame(raw) {
  log('←', raw);
  let f;
  try {
    f = JSON.parse(raw);
  } catch (e) {
    return;
  }
  if (f && f.op === 'rejected' && !f.id) note(`server: ${f.code}: ${f.message || ''}`);
}

// ---- the view ----

// membership replays a conversation's membership events in seq order.
function membership(c, evs) {
  let members = new Set();
  let owner = '';
  let removed = false;
  if (c.created && !evs.some((e) => e.kind === 'create')) {
    owner = S.user;
    members = new Set([S.user, ...c.created.members]);
  }
  for (const e of evs) {
    switch (e.kind) {
      case 'create':
        owner = e.sender;
        members = new Set([e.sender, ...(e.members || [])]);
        break;
      case 'join':
        members.add(e.userId);
        if (e.userId === S.user) removed = false;
        break;
      case 'kick':
      case 'leave': {
        const who = e.userId || e.sender;
        members.delete(who);
        if (who === S.user) removed = true;
        break;
      }
    }
  }
  return {members, owner, removed};
}

function messagesOf(id) {
  return S.client ? S.client.messages(id) : [];
}

// markShown records the open conversation as read up to the highest seq it
// shows of someone else's (one's own messages never count as unread, so
// sending needs no read after it), while the page is visible. The client
// coalesces the reads.
function markShown() {
  const cl = S.client;
  const c = S.selected ? S.convs.get(S.selected) : null;
  if (!cl || !c || document.visibilityState !== 'visible') return;
  const evs = cl.messages(c.id);
  if (evs.length === 0 || membership(c, evs).removed) return;
  let i = evs.length - 1;
  while (i >= 0 && evs[i].sender === S.user) i--;
  if (i < 0) return;
  const top = evs[i].seq;
  if (top <= cl.readSeq(c.id) || top <= c.asked) return;
  c.asked = top;
  const run = S.run;
  cl.markRead(c.id, top).then(() => {}, (err) => {
    if (run === S.run && err.code !== 'closed') note(failure(`read ${c.id} up to #${top}`, err));
  });
}

// ---- commands from the page ----
function createConversation(id, members) {
  const run = S.run;
  S.client.create(id, members).then((a) => {
    if (run !== S.run) return;
    conv(id).created = {members};
    S.selected = id;
    note(`created ${id} (seq ${a.seq})`);
    scheduleRender();
  }, (err) => {
    if (run === S.run) note(failure(`create ${id}`, err));
  });
}

function sendMessage(c, body) {
  const cmid = randomId();
  const m = {body, seq: 0, messageId: '', status: 'sending'};
  c.mine.set(cmid, m);
  S.client.sendWithId(c.id, cmid, body).then((a) => {
    // The cursors move only with events and synced replies: the event
    // still comes, pushed or through sync.
    Object.assign(m, {seq: a.seq, messageId: a.messageId, status: 'accepted'});
  }, (err) => {
    m.status = `rejected: ${failure('send', err)}`;
  }).finally(scheduleRender);
  scheduleRender();
}

function changeMembers(c, op, userID) {
  const run = S.run;
  const cl = S.client;
  const p = op === 'join' ? cl.join(c.id, userID) : op === 'kick' ? cl.kick(c.id, userID) : cl.leave(c.id);
  p.then((a) => {
    if (run === S.run) note(`${op} ${userID || ''} accepted (seq ${a.seq})`);
  }, (err) => {
    if (run === S.run) note(failure(`${op} ${userID || ''}`, err));
  });
}

function loadOlder(c) {
  const run = S.run;
  const evs = messagesOf(c.id);
  const opts = {limit: 50};
  if (evs.length) opts.beforeSeq = evs[0].seq;
  S.client.history(c.id, opts).then((page) => {
    if (run !== S.run) return;
    if (page.length < 50) note(`nothing older in ${c.id}`);
    scheduleRender();
  }, (err) => {
    if (run === S.run) note(failure('history', err));
  });
}

// ---- rendering ----
let renderQueued = false;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  queueMicrotask(() => {
    renderQueued = false;
    render();
  });
}

function render() {
  renderList();
  renderConversation();
  markShown();
}

function renderList() {
  const ul = $('#conv-list');
  ul.replaceChildren();
  const cl = S.client;
  const ids = new Set(S.convs.keys());
  if (cl) for (const id of cl.conversationIds()) ids.add(id);
  for (const id of [...ids].sort()) {
    const c = conv(id);
    const evs = messagesOf(id);
    const last = Math.max(evs.length ? evs[evs.length - 1].seq : 0, c.lastSeq);
    const readSeq = cl ? cl.readSeq(id) : 0;
    const unread = cl ? cl.unread(id, S.user) : 0;
    ul.append(h('li', {
      'data-conv': id,
      'data-unread': unread,
      'data-read-seq': readSeq,
      class: [id === S.selected ? 'selected' : '', membership(c, evs).removed ? 'removed' : ''].join(' ').trim() || null,
      title: readSeq ? `read up to #${readSeq}` : 'nothing read yet',
      onclick: () => {
        S.selected = id;
        render();
      },
    }, h('span', {class: 'name'}, id),
    unread ? h('span', {class: 'badge', title: `${unread} unread`}, unread) : null,
    h('span', {class: 'seqhint'}, last ? `#${last}` : '')));
  }
}

function eventText(e) {
  switch (e.kind) {
    case 'create': return `${e.sender} created the conversation with ${(e.members || []).join(', ') || 'nobody else'}`;
    case 'join': return e.sender === e.userId ? `${e.userId} joined` : `${e.sender} added ${e.userId}`;
    case 'kick': return `${e.sender} removed ${e.userId}`;
    case 'leave': return `${e.userId || e.sender} left`;
    case 'moved': return '(moved to another shard writer; nothing changes for its members)';
    default: return e.body || '';
  }
}

function timeOf(iso) {
  const d = new Date(iso);
  return isNaN(d) ? '' : d.toLocaleTimeString();
}

function renderConversation() {
  const c = S.selected ? S.convs.get(S.selected) : null;
  $('#conv-head').hidden = !c;
  const evs = c ? messagesOf(c.id) : [];
  const mem = c ? membership(c, evs) : null;
  $('#composer').hidden = !c || mem.removed;
  $('#empty').hidden = !!c;
  const ol = $('#events');
  ol.replaceChildren();
  if (!c) return;
  $('#conv-title').textContent = c.id + (mem.removed ? ' (you are no longer a member)' : '');
  for (const sel of ['#add-member-id', '#add-member-btn', '#leave']) $(sel).hidden = mem.removed;
  $('#members').replaceChildren(...[...mem.members].sort().map((u) => h('span', {class: 'member', 'data-user': u},
    u + (u === mem.owner ? ' ★' : ''),
    mem.owner === S.user && u !== S.user && !mem.removed
      ? h('button', {type: 'button', class: 'kick', title: `remove ${u}`, onclick: () => changeMembers(c, 'kick', u)}, '×')
      : null)));

  // Events by seq; own messages not delivered yet at their accepted seq,
  // or at the end while they wait for it.
  const delivered = new Set();
  for (const e of evs) if (e.messageId) delivered.add(e.messageId);
  const rows = evs.map((e) => ({seq: e.seq, e}));
  for (const [cmid, m] of c.mine) {
    if (m.messageId && delivered.has(m.messageId)) continue;
    rows.push({seq: m.seq || Infinity, m, cmid});
  }
  rows.sort((a, b) => a.seq - b.seq);
  const acceptedIDs = new Map();
  for (const m of c.mine.values()) if (m.messageId) acceptedIDs.set(m.messageId, m);
  for (const r of rows) {
    if (r.e) {
      const e = r.e;
      const mine = e.sender === S.user;
      const acc = mine ? acceptedIDs.get(e.messageId) : null; // sent from this page
      ol.append(h('li', {
        class: `ev ${e.kind === 'message' ? 'msg' : 'meta'}${mine ? ' mine' : ''}`,
        'data-conv': c.id, 'data-seq': e.seq, 'data-kind': e.kind, 'data-src': 'event',
        'data-accepted-seq': acc ? acc.seq : null,
        title: `seq ${e.seq} · message_id ${e.messageId} · ${e.createdAt}`,
      },
      h('span', {class: 'seq'}, `#${e.seq}`),
      e.kind === 'message' ? h('span', {class: 'who'}, e.sender) : null,
      h('span', {class: 'body'}, eventText(e)),
      h('span', {class: 'when'}, timeOf(e.createdAt) + (acc ? ` · accepted #${acc.seq}` : ''))));
    } else {
      const m = r.m;
      ol.append(h('li', {
        class: `ev msg mine pending${m.status.startsWith('rejected') ? ' failed' : ''}`,
        'data-conv': c.id, 'data-seq': m.seq || null, 'data-kind': 'message', 'data-src': 'accepted',
        'data-accepted-seq': m.seq || null, 'data-cmid': r.cmid, title: `client_message_id ${r.cmid}`,
      },
      h('span', {class: 'seq'}, m.seq ? `#${m.seq}` : '…'),
      h('span', {class: 'who'}, S.user),
      h('span', {class: 'body'}, m.body),
      h('span', {class: 'when'}, m.status === 'accepted' ? `accepted #${m.seq} · waiting for the event` : m.status)));
    }
  }
  ol.scrollTop = ol.scrollHeight;
}

// ---- wiring ----
$('#login').addEventListener('submit', (e) => {
  e.preventDefault();
  const user = $('#user').value.trim();
  if (user) start(user);
});
$('#new-conv').addEventListener('submit', (e) => {
  e.preventDefault();
  if (!S.client) return note('connect first');
  const id = $('#new-conv-id').value.trim() || randomId().replace(/^m-/, 'c-').slice(0, 18);
  const members = $('#new-conv-members').value.split(/[\s,]+/).map((s) => s.trim()).filter((s) => s && s !== S.user);
  createConversation(id, members);
  $('#new-conv-id').value = '';
  $('#new-conv-members').value = '';
});
$('#composer').addEventListener('submit', (e) => {
  e.preventDefault();
  const c = S.convs.get(S.selected);
  const body = $('#body').value;
  if (!S.client || !c || !body) return;
  sendMessage(c, body);
  $('#body').value = '';
});
$('#add-member').addEventListener('submit', (e) => {
  e.preventDefault();
  const c = S.convs.get(S.selected);
  const u = $('#add-member-id').value.trim();
  if (!S.client || !c || !u) return;
  changeMembers(c, 'join', u);
  $('#add-member-id').value = '';
});
$('#leave').addEventListener('click', () => {
  const c = S.convs.get(S.selected);
  if (S.client && c && confirm(`leave ${c.id}?`)) changeMembers(c, 'leave');
});
$('#older').addEventListener('click', () => {
  const c = S.convs.get(S.selected);
  if (S.client && c) loadOlder(c);
});
$('#offline').addEventListener('change', () => {
  const c = S.client;
  if (!c) return; // start() looks at the box before each dial
  if ($('#offline').checked) {
    c.pause();
  } else {
    setStatus('connecting', `connecting as ${S.user}…`);
    c.resume();
  }
});
// Back on the page: what it shows now is read.
document.addEventListener('visibilitychange', () => markShown());

// The page's state (and S.client, the Client), for people poking at it
// from the console.
window.chatpipe = S;

(async () => {
  try {
    const r = await fetch('/web/config');
    S.dev = (await r.json()).dev === true;
  } catch (e) {
    S.dev = false;
  }
  $('#token-field').hidden = S.dev;
  const q = new URL(location.href).searchParams.get('user');
  const user = q || localStorage.getItem('chatpipe.user') || '';
  $('#user').value = user;
  if (q) start(q);
})();
