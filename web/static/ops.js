// chatpipe ops page: polls GET /ops/state once a second and draws the
// pipeline. Every piece of server data reaches the DOM through textContent.
'use strict';

(() => {
  const $ = (sel) => document.querySelector(sel);
  const POLL_MS = 1000;

  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      e.setAttribute(k, String(v));
    }
    for (const k of kids) if (k !== undefined && k !== null) e.append(typeof k === 'object' ? k : String(k));
    return e;
  }

  // Colours: each worker gets the next hue around the wheel by the golden
  // angle, in the order the page first sees them, so neighbours differ.
  const colours = new Map();
  function colour(worker) {
    if (!worker) return '#d9d9d9';
    if (!colours.has(worker)) colours.set(worker, `hsl(${Math.round((colours.size * 137.508 + 200) % 360)} 62% 52%)`);
    return colours.get(worker);
  }

  const fmt = (x, digits = 0) => (x === undefined || x === null ? '–' : Number(x).toLocaleString(undefined, {maximumFractionDigits: digits}));
  // lag is a consumer's offsets behind; negative means the end is unknown.
  const lag = (c) => (c.behind < 0 ? '? (no end offsets)' : `${fmt(c.behind)} offsets`);

  let prev = null; // the previous state's shards
  const moves = [];

  function renderTiles(s) {
    const live = s.workers.filter((w) => w.state === 'live').length;
    $('#t-events').textContent = fmt(s.rates.events_per_second, 1);
    $('#t-accepted').textContent = fmt(s.rates.gateway_accepted_per_second, 1);
    $('#t-workers').textContent = `${live} / ${s.workers.length}`;
    $('#t-live').textContent = `${s.shards.filter((x) => x.live).length} / ${s.shards.length}`;
    $('#t-takeovers').textContent = fmt(s.totals.takeovers);
    $('#t-fenced').textContent = fmt(s.totals.fenced_writes);
    $('#t-fenced').parentElement.classList.toggle('alert', s.totals.fenced_writes > 0);
    $('#t-unknown').textContent = fmt(s.totals.unknown_commits);
    const cons = (name) => (s.consumers || []).find((c) => c.consumer === name);
    const persist = cons('persist');
    $('#t-persist').textContent = persist ? lag(persist) : s.persist_lag_records !== undefined ? `${fmt(s.persist_lag_records)} records` : '–';
    $('#t-coordinator').textContent = s.coordinator || '–';
  }

  function renderGrid(s) {
    const grid = $('#grid');
    grid.classList.toggle('dense', s.vshards > 512);
    // The grid holds the hashed vshards; the dedicated ones (after them)
    // have a table of their own (renderDedicated).
    const hashed = s.shards.slice(0, s.vshards);
    if (grid.children.length !== hashed.length) {
      grid.replaceChildren(...hashed.map((x) => h('div', {class: 'cell', 'data-vshard': x.vshard})));
    }
    const moved = [];
    for (const x of s.shards) {
      const before = prev && prev[x.vshard];
      if (before && before.worker !== x.worker) moved.push({vshard: x.vshard, from: before.worker, to: x.worker, epoch: x.epoch});
      if (x.dedicated) continue;
      const cell = grid.children[x.vshard];
      cell.style.backgroundColor = colour(x.worker);
      cell.dataset.worker = x.worker;
      cell.dataset.epoch = x.epoch;
      cell.dataset.live = x.live;
      cell.classList.toggle('dead', !!x.worker && !x.live);
      cell.title = x.worker
        ? `vshard ${x.vshard}\nowner ${x.worker} (gen ${x.gen})\nepoch ${x.epoch}\n${x.live ? 'live' : "owner's lease is gone"}`
        : `vshard ${x.vshard}\nno owner yet`;
      if (before && before.worker !== x.worker) {
        cell.classList.remove('moved');
        void cell.offsetWidth; // restart the animation
        cell.classList.add('moved');
      }
    }
    prev = s.shards;
    if (moved.length) {
      const byPair = new Map();
      for (const m of moved) {
        const k = `${m.from || '∅'} → ${m.to || '∅'}`;
        if (!byPair.has(k)) byPair.set(k, []);
        byPair.get(k).push(m);
      }
      const t = new Date(s.time).toLocaleTimeString();
      for (const [pair, ms] of byPair) {
        const what = ms.length === 1 ? `vshard ${ms[0].vshard} (epoch ${ms[0].epoch})` : `${ms.length} vshards`;
        moves.unshift(`${t}  ${what}: ${pair}`);
      }
      moves.splice(50);
      $('#moves').replaceChildren(...moves.map((m) => h('li', {}, m)));
    }
    const counts = new Map();
    for (const x of s.shards) if (x.worker) counts.set(x.worker, (counts.get(x.worker) || 0) + 1);
    $('#legend').replaceChildren(...[...counts].sort().map(([w, n]) => h('span', {class: 'chip', 'data-worker': w},
      h('i', {style: `background:${colour(w)}`}), `${w}: ${n}`)));
  }

  // renderDedicated lists the dedicated vshards with their owner and the
  // conversations isolated to each, and the releases in progress.
  function renderDedicated(s) {
    const overrides = s.overrides || [];
    $('#dedicated-box').hidden = !s.dedicated && !overrides.length;
    const rows = s.shards.filter((x) => x.dedicated).map((x) => h('tr', {'data-vshard': x.vshard, class: x.worker && !x.live ? 'dead' : ''},
      h('td', {}, x.vshard),
      h('td', {}, x.worker ? h('i', {class: 'swatch', style: `background:${colour(x.worker)}`}) : null, x.worker || 'no owner yet'),
      h('td', {}, x.worker ? x.epoch : '–'),
      h('td', {}, x.worker ? (x.live ? 'live' : "owner's lease is gone") : '–'),
      h('td', {class: 'convs'}, (x.conversations || []).join(', ') || '–')));
    $('#dedicated tbody').replaceChildren(...rows);
    $('#releasing').replaceChildren(...overrides.filter((o) => !o.isolated).map((o) => h('li', {'data-conversation': o.conversation},
      `${o.conversation}: moving home to vshard ${o.vshard} (override since ${new Date(o.since).toLocaleTimeString()})`)));
  }

  function renderWorkers(s) {
    const rows = s.workers.map((w) => {
      const m = w.metrics || {};
      const avg = m.takeover_seconds_count ? `${fmt((1000 * m.takeover_seconds_sum) / m.takeover_seconds_count)} ms` : '–';
      return h('tr', {'data-worker': w.id, 'data-state': w.state, class: w.state},
        h('td', {}, h('i', {class: 'swatch', style: `background:${colour(w.id)}`}), w.id),
        h('td', {title: w.error || ''}, w.state),
        h('td', {}, w.lease_ttl_seconds >= 0 ? `${w.lease_ttl_seconds} s` : '–'),
        h('td', {}, w.gen || '–'),
        h('td', {}, `${w.owned} / ${w.rows}`),
        h('td', {}, fmt(w.events_per_second, 1)),
        h('td', {}, fmt(m.takeovers_total)),
        h('td', {class: m.fenced_writes_total > 0 ? 'alert' : ''}, fmt(m.fenced_writes_total)),
        h('td', {}, fmt(m.unknown_commits_total)),
        h('td', {}, fmt(m.lease_renewals_total)),
        h('td', {}, avg),
        h('td', {class: 'addr'}, [w.addr, w.admin].filter(Boolean).join(' · ')));
    });
    $('#workers tbody').replaceChildren(...rows);
  }

  function renderConsumers(s) {
    const now = new Date(s.time);
    $('#consumers tbody').replaceChildren(...(s.consumers || []).map((c) => h('tr', {'data-consumer': c.consumer},
      h('td', {}, c.consumer),
      h('td', {}, c.behind < 0 ? '?' : fmt(c.behind)),
      h('td', {}, `${fmt(Math.max(0, (now - new Date(c.updated_at)) / 1000), 1)} s ago`),
      h('td', {class: 'parts'}, c.partitions.map((p) => `p${p.partition} ${p.next_offset}/${p.end_offset < 0 ? '?' : p.end_offset}`).join('  ')))));
    $('#errors').replaceChildren(...(s.errors || []).map((e) => h('li', {}, e)));
  }

  async function poll() {
    try {
      const r = await fetch('/ops/state', {cache: 'no-store'});
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      const s = await r.json();
      renderTiles(s);
      renderGrid(s);
      renderDedicated(s);
      renderWorkers(s);
      renderConsumers(s);
      const st = $('#status');
      st.dataset.state = 'open';
      st.textContent = `updated ${new Date(s.time).toLocaleTimeString()}`;
      window.chatpipeOps = s; // the last state, for the console
    } catch (e) {
      const st = $('#status');
      st.dataset.state = 'error';
      st.textContent = `cannot read /ops/state: ${e.message || e}`;
    }
    setTimeout(poll, POLL_MS);
  }
  poll();
})();
