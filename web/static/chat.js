// chatpipe chat page: a client of the public websocket protocol
// (docs/protocol.md). No framework; every piece of user data reaches the
// DOM through textContent.
'use strict';

(() => {
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

  function randomID(prefix) {
    const b = new Uint8Array(8);
    crypto.getRandomValues(b);
    return prefix + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }

  const S = {
    dev: false,
    user: '',
    token: '',
    ws: null,
    openedAt: 0,
    attempt: 0,
    want: false, // the user asked to be connected
    reconnectTimer: null,
    nextReq: 1,
    // Commands without an answer, by request id. They are sent again with
    // the same ids after a reconnect: dedupe returns the first result.
    pending: new Map(),
    convs: new Map(),
    selected: null,
    syncServed: true,
  };

  // conv returns the conversation's local state, made on first use.
  function conv(id) {
    let c = S.convs.get(id);
    if (!c) {
      c = {
        id,
        events: new Map(), // seq → event; duplicates dropped by (conversation_id, seq)
        cursor: 0, // the highest seq seen (shown in the list)
        synced: 0, // from the last synced reply: what sync starts after (pushed events may follow a gap)
        mine: new Map(), // client_message_id → {body, seq, message_id, status}
        members: new Set(),
        owner: '',
        removed: false,
        unread: 0,
      };
      S.convs.set(id, c);
    }
    return c;
  }

  // ---- protocol log ----
  const logLines = [];
  function log(dir, obj) {
    const t = new Date().toISOString().slice(11, 23);
    logLines.push(`${t} ${dir} ${typeof obj === 'string' ? obj : JSON.stringify(obj)}`);
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

  // ---- connection ----
  function wsURL(token) {
    const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
    return `${scheme}${location.host}/v1/ws?token=${encodeURIComponent(token)}`;
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

  async function connect() {
    clearTimeout(S.reconnectTimer);
    S.reconnectTimer = null;
    if (!S.want || $('#offline').checked || S.ws) return;
    setStatus('connecting', `connecting as ${S.user}…`);
    try {
      // In dev a fresh token per connection: an expired one never blocks
      // a reconnect.
      if (S.dev) S.token = await devToken(S.user);
      else S.token = $('#token').value.trim();
      if (!S.token) throw new Error('paste a token first (chatpipe token --user …)');
    } catch (e) {
      setStatus('error', String(e.message || e));
      scheduleReconnect();
      return;
    }
    if (!S.want || S.ws) return;
    const ws = new WebSocket(wsURL(S.token));
    S.ws = ws;
    ws.onopen = () => {
      if (S.ws !== ws) return;
      S.openedAt = Date.now();
      setStatus('open', `connected as ${S.user}`);
      log('··', 'open');
      // Writes again with the same ids (dedupe answers); reads are not
      // resent: the one fresh sync below replaces an unanswered one.
      for (const [id, p] of S.pending) {
        if (p.frame.op === 'sync' || p.frame.op === 'history') S.pending.delete(id);
        else write(p.frame);
      }
      sync();
    };
    ws.onmessage = (m) => {
      if (S.ws !== ws) return;
      let f;
      try {
        f = JSON.parse(m.data);
      } catch (e) {
        log('←', `unparseable frame: ${m.data}`);
        return;
      }
      log('←', f);
      onFrame(f);
    };
    ws.onclose = (e) => {
      if (S.ws !== ws) return;
      S.ws = null;
      log('··', `closed ${e.code}${e.reason ? ' ' + e.reason : ''}`);
      if (!S.want) {
        setStatus('idle', 'not connected');
      } else if ($('#offline').checked) {
        setStatus('offline', `offline (${S.user})`);
      } else {
        scheduleReconnect(e.code);
      }
    };
  }

  // scheduleReconnect waits random(0, min(30 s, 250 ms × 2^attempt)) — full
  // jitter — and resets the attempts after a connection that lived a minute.
  function scheduleReconnect(code) {
    if (S.openedAt && Date.now() - S.openedAt >= 60000) S.attempt = 0;
    S.openedAt = 0;
    const delay = Math.floor(Math.random() * Math.min(30000, 250 * 2 ** S.attempt));
    S.attempt = Math.min(S.attempt + 1, 20);
    setStatus('reconnecting', `reconnecting in ${delay} ms${code ? ` (closed ${code})` : ''}`);
    clearTimeout(S.reconnectTimer);
    S.reconnectTimer = setTimeout(connect, delay);
  }

  function disconnect() {
    S.want = false;
    clearTimeout(S.reconnectTimer);
    if (S.ws) {
      const ws = S.ws;
      S.ws = null;
      ws.close(1000, 'bye');
    }
  }

  function write(frame) {
    if (!S.ws || S.ws.readyState !== WebSocket.OPEN) return false;
    S.ws.send(JSON.stringify(frame));
    log('→', frame);
    return true;
  }

  // request sends a command; onAnswer gets its accepted/rejected/synced/
  // history frame. Unanswered commands survive reconnects.
  function request(frame, onAnswer) {
    frame.id = `r${S.nextReq++}-${randomID('').slice(0, 6)}`;
    S.pending.set(frame.id, {frame, onAnswer});
    write(frame);
    return frame.id;
  }

  function sync(cursors) {
    if (!S.syncServed) return;
    if (!cursors) {
      cursors = {};
      for (const c of S.convs.values()) if (c.synced > 0) cursors[c.id] = c.synced;
    }
    request({op: 'sync', cursors}, (r) => {
      if (r.op === 'rejected') {
        if (r.code === 'bad_request') {
          S.syncServed = false;
          note(`sync is not served here (${r.message}); showing live events only`);
        }
        return;
      }
      const next = {};
      for (const [id, seq] of Object.entries(r.cursors || {})) {
        const c = conv(id);
        c.synced = Math.max(c.synced, seq);
        c.cursor = Math.max(c.cursor, seq);
        next[id] = c.synced;
      }
      render();
      if (r.more === true) {
        for (const c of S.convs.values()) if (c.synced > 0 && !(c.id in next)) next[c.id] = c.synced;
        sync(next); // capped: go on from the cursors it returned
      }
    });
  }

  // ---- frames from the server ----
  function onFrame(f) {
    if (f.op === 'event') {
      onEvent(f);
      return;
    }
    if (!f.id) {
      note(`server: ${f.code || f.op}: ${f.message || ''}`);
      return;
    }
    const p = S.pending.get(f.id);
    if (!p) return; // an answer to a command sent before a reconnect, already answered
    if (f.op === 'rejected' && (f.code === 'rate_limited' || f.code === 'unavailable')) {
      // Wait as told, then send the same command with the same ids.
      const wait = Math.max(f.retry_after_ms || 0, 100);
      setTimeout(() => {
        if (S.pending.get(f.id) === p) write(p.frame);
      }, wait);
      return;
    }
    S.pending.delete(f.id);
    if (p.onAnswer) p.onAnswer(f);
    render();
  }

  function onEvent(ev) {
    const c = conv(ev.conversation_id);
    if (c.events.has(ev.seq)) return; // at-least-once delivery: drop duplicates
    c.events.set(ev.seq, ev);
    c.cursor = Math.max(c.cursor, ev.seq);
    applyMembership(c);
    if (S.selected !== c.id && ev.kind === 'message' && ev.sender !== S.user) c.unread++;
    if (!S.selected) S.selected = c.id;
    render();
  }

  // applyMembership replays the membership events in seq order.
  function applyMembership(c) {
    c.members = new Set();
    c.owner = '';
    c.removed = false;
    for (const seq of [...c.events.keys()].sort((a, b) => a - b)) {
      const e = c.events.get(seq);
      switch (e.kind) {
        case 'create':
          c.owner = e.sender;
          c.members = new Set([e.sender, ...(e.members || [])]);
          break;
        case 'join':
          c.members.add(e.user_id);
          if (e.user_id === S.user) c.removed = false;
          break;
        case 'kick':
        case 'leave': {
          const who = e.user_id || e.sender;
          c.members.delete(who);
          if (who === S.user) c.removed = true;
          break;
        }
      }
    }
  }

  // ---- commands from the page ----
  function createConversation(id, members) {
    request({op: 'create', conversation_id: id, members}, (r) => {
      if (r.op === 'accepted') {
        const c = conv(id);
        c.owner = S.user;
        if (c.members.size === 0) c.members = new Set([S.user, ...members]);
        c.createdSeq = r.seq;
        S.selected = id;
        note(`created ${id} (seq ${r.seq})`);
      } else {
        note(`create ${id}: ${r.code}: ${r.message || ''}`);
      }
    });
  }

  function sendMessage(c, body) {
    const cmid = randomID('m-');
    c.mine.set(cmid, {body, seq: 0, message_id: '', status: 'sending'});
    request({op: 'send', conversation_id: c.id, client_message_id: cmid, body}, (r) => {
      const m = c.mine.get(cmid);
      if (r.op === 'accepted') {
        // The cursors move only with events and synced replies: sync must still bring this one.
        Object.assign(m, {seq: r.seq, message_id: r.message_id, status: 'accepted'});
      } else {
        Object.assign(m, {status: `rejected: ${r.code}${r.message ? ' — ' + r.message : ''}`});
      }
    });
    render();
  }

  function membership(c, op, userID) {
    const frame = {op, conversation_id: c.id};
    if (userID) frame.user_id = userID;
    request(frame, (r) => {
      note(r.op === 'accepted' ? `${op} ${userID || ''} accepted (seq ${r.seq})` : `${op} ${userID || ''}: ${r.code}: ${r.message || ''}`);
    });
  }

  function loadOlder(c) {
    const seqs = [...c.events.keys()];
    const frame = {op: 'history', conversation_id: c.id, limit: 50};
    if (seqs.length) frame.before_seq = Math.min(...seqs);
    request(frame, (r) => {
      if (r.op !== 'history') {
        note(`history: ${r.code}: ${r.message || ''}`);
        return;
      }
      for (const e of r.events || []) onEvent({op: 'event', conversation_id: c.id, ...e});
      if ((r.events || []).length < 50) note(`nothing older in ${c.id}`);
    });
  }

  // ---- rendering ----
  function render() {
    renderList();
    renderConversation();
  }

  function renderList() {
    const ul = $('#conv-list');
    ul.replaceChildren();
    const ids = [...S.convs.keys()].sort();
    for (const id of ids) {
      const c = S.convs.get(id);
      ul.append(h('li', {
        'data-conv': id,
        class: [id === S.selected ? 'selected' : '', c.removed ? 'removed' : ''].join(' ').trim() || null,
        onclick: () => { S.selected = id; c.unread = 0; render(); },
      }, h('span', {class: 'name'}, id),
      c.unread ? h('span', {class: 'badge'}, c.unread) : null,
      h('span', {class: 'seqhint'}, c.cursor ? `#${c.cursor}` : '')));
    }
  }

  function eventText(e) {
    switch (e.kind) {
      case 'create': return `${e.sender} created the conversation with ${(e.members || []).join(', ') || 'nobody else'}`;
      case 'join': return e.sender === e.user_id ? `${e.user_id} joined` : `${e.sender} added ${e.user_id}`;
      case 'kick': return `${e.sender} removed ${e.user_id}`;
      case 'leave': return `${e.user_id || e.sender} left`;
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
    $('#composer').hidden = !c || c.removed;
    $('#empty').hidden = !!c;
    const ol = $('#events');
    ol.replaceChildren();
    if (!c) return;
    c.unread = 0;
    $('#conv-title').textContent = c.id + (c.removed ? ' (you are no longer a member)' : '');
    for (const sel of ['#add-member-id', '#add-member-btn', '#leave']) $(sel).hidden = c.removed;
    const mem = $('#members');
    mem.replaceChildren(...[...c.members].sort().map((u) => h('span', {class: 'member', 'data-user': u},
      u + (u === c.owner ? ' ★' : ''),
      c.owner === S.user && u !== S.user && !c.removed
        ? h('button', {type: 'button', class: 'kick', title: `remove ${u}`, onclick: () => membership(c, 'kick', u)}, '×')
        : null)));

    // Events by seq; own messages not delivered yet at their accepted seq,
    // or at the end while they wait for it.
    const delivered = new Set();
    for (const e of c.events.values()) if (e.message_id) delivered.add(e.message_id);
    const rows = [];
    for (const [seq, e] of c.events) rows.push({seq, e});
    for (const [cmid, m] of c.mine) {
      if (m.message_id && delivered.has(m.message_id)) continue;
      rows.push({seq: m.seq || Infinity, m, cmid});
    }
    rows.sort((a, b) => a.seq - b.seq);
    const acceptedIDs = new Map();
    for (const m of c.mine.values()) if (m.message_id) acceptedIDs.set(m.message_id, m);
    for (const r of rows) {
      if (r.e) {
        const e = r.e;
        const mine = e.sender === S.user;
        const acc = mine ? acceptedIDs.get(e.message_id) : null; // sent from this page
        ol.append(h('li', {
          class: `ev ${e.kind === 'message' ? 'msg' : 'meta'}${mine ? ' mine' : ''}`,
          'data-conv': c.id, 'data-seq': e.seq, 'data-kind': e.kind, 'data-src': 'event',
          'data-accepted-seq': acc ? acc.seq : null,
          title: `seq ${e.seq} · message_id ${e.message_id} · ${e.created_at}`,
        },
        h('span', {class: 'seq'}, `#${e.seq}`),
        e.kind === 'message' ? h('span', {class: 'who'}, e.sender) : null,
        h('span', {class: 'body'}, eventText(e)),
        h('span', {class: 'when'}, timeOf(e.created_at) + (acc ? ` · accepted #${acc.seq}` : ''))));
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
  function start(user) {
    disconnect();
    S.user = user;
    S.pending.clear();
    S.convs.clear();
    S.selected = null;
    S.syncServed = true;
    S.attempt = 0;
    S.want = true;
    note('');
    render();
    const u = new URL(location.href);
    u.searchParams.set('user', user);
    history.replaceState(null, '', u);
    localStorage.setItem('chatpipe.user', user);
    connect();
  }

  $('#login').addEventListener('submit', (e) => {
    e.preventDefault();
    const user = $('#user').value.trim();
    if (user) start(user);
  });
  $('#new-conv').addEventListener('submit', (e) => {
    e.preventDefault();
    if (!S.want) return note('connect first');
    const id = $('#new-conv-id').value.trim() || randomID('c-');
    const members = $('#new-conv-members').value.split(/[\s,]+/).map((s) => s.trim()).filter((s) => s && s !== S.user);
    createConversation(id, members);
    $('#new-conv-id').value = '';
    $('#new-conv-members').value = '';
  });
  $('#composer').addEventListener('submit', (e) => {
    e.preventDefault();
    const c = S.convs.get(S.selected);
    const body = $('#body').value;
    if (!c || !body) return;
    sendMessage(c, body);
    $('#body').value = '';
  });
  $('#add-member').addEventListener('submit', (e) => {
    e.preventDefault();
    const c = S.convs.get(S.selected);
    const u = $('#add-member-id').value.trim();
    if (!c || !u) return;
    membership(c, 'join', u);
    $('#add-member-id').value = '';
  });
  $('#leave').addEventListener('click', () => {
    const c = S.convs.get(S.selected);
    if (c && confirm(`leave ${c.id}?`)) membership(c, 'leave');
  });
  $('#older').addEventListener('click', () => {
    const c = S.convs.get(S.selected);
    if (c) loadOlder(c);
  });
  $('#offline').addEventListener('change', () => {
    if ($('#offline').checked) {
      clearTimeout(S.reconnectTimer);
      if (S.ws) S.ws.close(4000, 'offline');
      else if (S.want) setStatus('offline', `offline (${S.user})`);
    } else if (S.want) {
      S.attempt = 0;
      connect();
    }
  });

  // The page's state, for people poking at it from the console.
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
})();
