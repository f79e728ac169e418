// Blazar's web console: one page over the daemon's console read model
// (GET /api/console/snapshot, GET /api/console/events) and its action routes.
// No library, no build step, no request to any host but this daemon.
"use strict";

const KEY_STORE = "blazar.console.key";
const VIEWS = {};
const state = {
  snap: null,
  key: sessionStorage.getItem(KEY_STORE),
  view: null,
  source: null, // "events" | "poll" | "legacy"
  pulls: {}, // name -> {status, completed, total, done, error}
  why: null,
  flash: null,
  armed: new Set(), // models whose Remove was clicked once

};

// -- small helpers -------------------------------------------------------

function el(tag, attrs, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.style.cssText = v; // CSSOM: allowed by the page's style-src 'self'

    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return node;
}

// Set a node's content to a string or a node, touching the DOM only when it changed.
function set(node, content) {
  const key = content instanceof Node ? content.outerHTML : String(content);
  if (node.__shown === key) return;
  node.__shown = key;
  node.replaceChildren(content);
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "—";
  if (n < 0) return `−${bytes(-n)}`;
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

function num(x, digits = 1) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  return Number(x).toFixed(digits);
}

function ms(x) {
  if (x === null || x === undefined) return "—";
  return x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${Math.round(x)} ms`;
}

function ago(unix) {
  if (!unix) return "—";
  const s = Math.max(0, Date.now() / 1000 - unix);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function until(unix) {
  if (!unix) return "—";
  const s = unix - Date.now() / 1000;
  if (s <= 0) return "now";
  if (s < 90) return `in ${Math.round(s)} s`;
  return `in ${Math.round(s / 60)} min`;
}

const GOOD = new Set(["ready", "running", "streaming", "done", "succeeded", "completed", "ok", "success"]);
const WAIT = new Set(["starting", "queued", "loading", "stopping", "pending", "in_progress", "validating"]);
const BAD = new Set(["failed", "error", "cancelled", "interrupted", "expired", "disconnected", "broken"]);

function pill(text) {
  const t = String(text ?? "—");
  const kind = GOOD.has(t) ? "ok" : WAIT.has(t) ? "warn" : BAD.has(t) ? "bad" : "";
  return el("span", { class: `pill ${kind}` }, t);
}

function empty(title, hint) {
  return el("div", { class: "empty" }, el("strong", {}, title), hint);
}

function isAdmin() {
  const v = state.snap && state.snap.viewer;
  return !v || v.admin !== false;
}

function flash(message, ok = false) {
  const box = document.getElementById("flash");
  box.textContent = message;
  box.className = ok ? "flash ok" : "flash";
  box.hidden = false;
  clearTimeout(state.flash);
  state.flash = setTimeout(() => { box.hidden = true; }, ok ? 4000 : 9000);
}

// -- talking to the daemon -------------------------------------------------

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (state.key) h.Authorization = `Bearer ${state.key}`;
  return h;
}

async function call(method, path, body) {
  const init = { method, headers: headers(body !== undefined ? { "Content-Type": "application/json" } : {}) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const resp = await fetch(path, init);
  if (resp.status === 401) askKey("That key was refused; paste another.");
  return resp;
}

async function failure(resp) {
  try {
    const doc = await resp.json();
    const e = doc.error;
    return (e && (e.message || e)) || doc.message || `HTTP ${resp.status}`;
  } catch (_) {
    return `HTTP ${resp.status}`;
  }
}

async function act(label, method, path, body) {
  try {
    const resp = await call(method, path, body);
    if (!resp.ok) { flash(`${label}: ${await failure(resp)}`); return null; }
    flash(`${label}: done`, true);
    return resp;
  } catch (err) {
    flash(`${label}: ${err.message}`);
    return null;
  }
}

// A result read with the tab's key (a plain link could not send it), saved as a file.
async function download(result) {
  try {
    const resp = await call("GET", result.url);
    if (!resp.ok) { flash(`download ${result.label}: ${await failure(resp)}`); return; }
    const url = URL.createObjectURL(await resp.blob());
    const a = el("a", { href: url, download: result.filename });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (err) {
    flash(`download ${result.label}: ${err.message}`);
  }
}

function setConn(kind, text) {
  const c = document.getElementById("conn");
  c.className = `conn conn-${kind}`;
  c.textContent = text;
}

function askKey(message) {
  const dlg = document.getElementById("login");
  const err = document.getElementById("login-error");
  err.hidden = !message;
  err.textContent = message || "";
  setConn("down", "key needed");
  if (!dlg.open) dlg.showModal();
}

// Server-sent events read with fetch (EventSource cannot send a bearer token).
async function follow() {
  for (;;) {
    let resp;
    try {
      resp = await fetch("/api/console/events?interval_ms=1000", { headers: headers({ Accept: "text/event-stream" }) });
    } catch (_) {
      setConn("down", "daemon unreachable, retrying…");
      await sleep(2000);
      continue;
    }
    if (resp.status === 401 || resp.status === 403) {
      askKey(state.key ? await failure(resp) : "");
      return;
    }
    if (resp.status === 404 || resp.status === 405) { legacy(); return; }
    if (!resp.ok || !resp.body) { await poll(); return; }
    state.source = "events";
    setConn("live", "live");
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let event = "message";
          const data = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          }
          if (event === "snapshot" && data.length) apply(JSON.parse(data.join("\n")));
        }
      }
    } catch (_) { /* the stream broke: reconnect */ }
    setConn("wait", "reconnecting…");
    await sleep(1000);
  }
}

// Polling fallback, when the stream cannot be held open.
async function poll() {
  state.source = "poll";
  for (;;) {
    try {
      const resp = await fetch("/api/console/snapshot", { headers: headers() });
      if (resp.status === 401 || resp.status === 403) { askKey(await failure(resp)); return; }
      if (resp.ok) { apply(await resp.json()); setConn("live", "live (polling)"); }
    } catch (_) { setConn("down", "daemon unreachable, retrying…"); }
    await sleep(1500);
  }
}

// A daemon without the console read model: compose what the older routes give.
async function legacy() {
  state.source = "legacy";
  const series = [];
  const seen = new Set();
  for (;;) {
    try {
      const get = async (p) => { const r = await fetch(p, { headers: headers() }); return r.ok ? r.json() : null; };
      const [tags, engines, reqs, q] = await Promise.all(
        [get("/api/tags"), get("/admin/engines"), get("/v1/requests"), get("/api/quantiles")]);
      const byModel = {};
      for (const e of (engines && engines.engines) || []) byModel[e.model] = e;
      const live = (reqs && reqs.data) || [];
      let fresh = 0;
      for (const r of live) if (!seen.has(r.id)) { seen.add(r.id); fresh++; }
      const now = Date.now() / 1000;
      series.push({ time: now, requests_per_s: fresh / 1.5, ttft_p50_s: null, tpot_p50_s: null,
        tokens_out_per_s: 0, errors_per_s: 0 });
      if (series.length > 200) series.shift();
      apply({
        time: now, version: null, viewer: null,
        models: ((tags && tags.models) || []).map((m) => {
          const e = byModel[m.name] || null;
          return { name: m.name, size_bytes: m.size, quant: m.details && m.details.quantization_level,
            ctx_train: null, capabilities: [], source: null, loaded: !!e, state: e && e.state,
            engine: e && e.engine, pid: e && e.pid, port: e && e.port, slots: e ? e.slots : null,
            busy: e ? e.in_flight : null, queued: null, ctx_per_slot: e && e.ctx_per_slot,
            memory_bytes: null, rss_bytes: null, expires_at: null, restarts: e ? e.restarts : 0,
            last_error: e && e.last_error, lane: e && e.lane, engine_version: e && e.version,
            breaker: e && e.breaker, breaker_retry_after_s: e && e.breaker_retry_after_s,
            stderr_tail: e && e.stderr_tail };
        }),
        requests: live, recent: [], rates: null, series: series.slice(), quantiles: q && q.models,
        jobs: [], memory: null,
      });
      setConn("live", "live (compat)");
    } catch (_) { setConn("down", "daemon unreachable, retrying…"); }
    await sleep(1500);
  }
}

function sleep(t) { return new Promise((r) => setTimeout(r, t)); }

// -- the shell ---------------------------------------------------------

function apply(snap) {
  state.snap = snap;
  const v = snap.viewer;
  document.getElementById("who").textContent = v && v.key ? `key ${v.key}${v.admin ? " (admin)" : ""}` : "";
  document.getElementById("signout").hidden = !state.key;
  document.getElementById("version").textContent = snap.version ? `Blazar ${snap.version}` : "";
  const n = (snap.requests || []).length;
  document.getElementById("live-count").textContent = n ? String(n) : "";
  const view = VIEWS[state.view];
  if (view && view.update) view.update(snap);
}

function show(name) {
  if (!VIEWS[name]) name = "dashboard";
  state.view = name;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.view === name);
  document.getElementById("title").textContent = VIEWS[name].title;
  document.title = `${VIEWS[name].title} · Blazar`;
  const root = document.getElementById("view");
  root.replaceChildren();
  root.dataset.view = name;
  VIEWS[name].drawn = null;
  VIEWS[name].mount(root);
  if (state.snap && VIEWS[name].update) VIEWS[name].update(state.snap);
}

// True when what a view would draw is what it drew last time (keeps buttons stable to click).
function same(view, ...parts) {
  const key = JSON.stringify(parts);
  if (view.drawn === key) return true;
  view.drawn = key;
  return false;
}

// -- charts (hand-drawn SVG: a line per series over the last minutes) ----

function lineChart(points, lines, opts = {}) {
  const W = 480, H = 150, L = 52, R = 8, T = 8, B = 20;
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", preserveAspectRatio: "none",
    role: "img", "aria-label": opts.label || "chart" });
  const xs = points.map((p) => p.time);
  const x0 = xs.length ? xs[0] : 0, x1 = xs.length ? xs[xs.length - 1] : 1;
  let ymax = 0;
  for (const ln of lines) for (const p of points) { const y = ln.get(p); if (y !== null && y !== undefined) ymax = Math.max(ymax, y); }
  ymax = ymax > 0 ? ymax * 1.15 : 1;
  const sx = (t) => L + ((t - x0) / Math.max(1, x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - y / ymax) * (H - T - B);
  for (let i = 0; i <= 3; i++) {
    const y = (ymax * i) / 3;
    box.append(svg("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "axis" }));
    const label = svg("text", { x: L - 5, y: sy(y) + 3, "text-anchor": "end" });
    label.textContent = (opts.fmt || ((v) => num(v, v < 10 ? 1 : 0)))(y);
    box.append(label);
  }
  if (xs.length > 1) {
    const span = Math.round(x1 - x0);
    const label = svg("text", { x: L, y: H - 5 });
    label.textContent = span >= 60 ? `${Math.round(span / 60)} min ago` : `${span} s ago`;
    const now = svg("text", { x: W - R, y: H - 5, "text-anchor": "end" });
    now.textContent = "now";
    box.append(label, now);
  }
  let drawn = 0;
  for (const ln of lines) {
    let d = "";
    let pen = false;
    const has = (i) => i >= 0 && i < points.length && points[i] && ln.get(points[i]) !== null && ln.get(points[i]) !== undefined;
    points.forEach((p, i) => {
      const y = ln.get(p);
      if (y === null || y === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${sx(p.time).toFixed(1)},${sy(y).toFixed(1)}`;
      pen = true;
      drawn++;
      if (!has(i - 1) && !has(i + 1)) box.append(svg("circle", { cx: sx(p.time), cy: sy(y), r: 2.5, fill: ln.color }));
    });
    if (d) box.append(svg("path", { d, fill: "none", stroke: ln.color, "stroke-width": 2,
      "vector-effect": "non-scaling-stroke", "stroke-linejoin": "round", class: "series" }));
  }
  box.dataset.points = String(drawn);
  return box;
}

function chartCard(title, lines, opts = {}) {
  const head = el("div", { class: "chart-head" }, el("h2", {}, title), el("span", { class: "now" }));
  const legend = el("div", { class: "legend" },
    lines.length > 1 ? lines.map((l) => el("span", {}, el("i", { style: `background:${l.color}` }), l.name)) : null);
  const body = el("div", { class: "chart-body" });
  const card = el("div", { class: "card chart-card", "data-chart": opts.id || title }, head, body, legend);
  return {
    card,
    update(points) {
      body.replaceChildren(lineChart(points, lines, opts));
      const last = points.length ? points[points.length - 1] : null;
      head.lastChild.textContent = last ? opts.now(last) : "";
    },
  };
}

// -- Dashboard ---------------------------------------------------------

VIEWS.dashboard = {
  title: "Dashboard",
  mount(root) {
    this.stats = el("div", { class: "stats" });
    const s = (v) => (v === null || v === undefined ? "—" : ms(v * 1000));
    this.charts = [
      chartCard("Requests per second", [
        { name: "requests", color: "var(--c1)", get: (p) => p.requests_per_s },
        { name: "errors", color: "var(--bad)", get: (p) => p.errors_per_s },
      ], { id: "rps", now: (p) => `${num(p.requests_per_s)} /s` }),
      chartCard("Time to first token (p50)", [{ name: "ttft", color: "var(--c2)", get: (p) => p.ttft_p50_s }],
        { id: "ttft", fmt: (v) => s(v), now: (p) => s(p.ttft_p50_s) }),
      chartCard("Time per output token (p50)", [{ name: "tpot", color: "var(--c4)", get: (p) => p.tpot_p50_s }],
        { id: "tpot", fmt: (v) => s(v), now: (p) => s(p.tpot_p50_s) }),
      chartCard("Tokens out per second", [{ name: "tokens", color: "var(--c3)", get: (p) => p.tokens_out_per_s }],
        { id: "tokens", now: (p) => `${num(p.tokens_out_per_s)} /s` }),
    ];
    this.load = el("div");
    root.append(this.stats, el("div", { class: "grid wide" }, this.charts.map((c) => c.card)),
      el("div", { class: "section" }, el("h2", {}, "Queues and slots"), this.load));
  },
  update(snap) {
    const r = snap.rates || {};
    const stat = (label, value, unit) => el("div", { class: "card stat" },
      el("div", { class: "label" }, label), el("div", { class: "value" }, value, unit ? el("span", { class: "unit" }, unit) : null));
    const reqs = snap.requests || [];
    const loaded = (snap.models || []).filter((m) => m.loaded);
    const errRate = r.requests_per_s ? (100 * (r.errors_per_s || 0)) / r.requests_per_s : 0;
    this.stats.replaceChildren(
      stat("Requests", num(r.requests_per_s), "/s"),
      stat("Error rate", num(errRate, 1), "%"),
      stat("Tokens in", num(r.tokens_in_per_s, 0), "/s"),
      stat("Tokens out", num(r.tokens_out_per_s, 0), "/s"),
      stat("Live requests", String(reqs.length)),
      stat("Loaded models", `${loaded.length}`, `of ${(snap.models || []).length}`),
    );
    for (const c of this.charts) c.update(snap.series || []);
    if (!loaded.length) {
      this.load.replaceChildren(el("div", { class: "card" }, empty("No model is loaded",
        "A model loads on its first request: send one from the Playground, or load one in Models.")));
      return;
    }
    this.load.replaceChildren(el("div", { class: "card table-card" }, el("table", {},
      el("thead", {}, el("tr", {}, ["Model", "State", "Slots busy", "", "Queued"].map((t) => el("th", {}, t)))),
      el("tbody", {}, loaded.map((m) => el("tr", { "data-model": m.name },
        el("td", {}, el("strong", {}, m.name)), el("td", {}, pill(m.state)),
        el("td", {}, `${m.busy ?? 0} / ${m.slots ?? "—"}`),
        el("td", { style: "width:40%" }, el("div", { class: "bar" },
          el("div", { style: `width:${m.slots ? (100 * (m.busy || 0)) / m.slots : 0}%` }))),
        el("td", {}, String(m.queued ?? 0))))))));
  },
};

// -- Models ------------------------------------------------------------

VIEWS.models = {
  title: "Models",
  mount(root) {
    this.table = el("div");
    this.pullBox = el("div", { class: "card", id: "pull-card" });
    root.append(this.pullBox, el("div", { class: "section" }, this.table));
    this.drawPull();
  },
  drawPull() {
    const box = this.pullBox;
    box.replaceChildren();
    if (!isAdmin()) { box.hidden = true; return; }
    box.hidden = false;
    const input = el("input", { id: "pull-name", placeholder: "a model name: smollm2, qwen2.5:0.5b, org/repo:Q4_K_M, ollama:…",
      style: "flex:1; min-width: 260px" });
    const form = el("form", { class: "row", onsubmit: (e) => { e.preventDefault(); if (input.value.trim()) pull(input.value.trim()); } },
      input, el("button", { class: "primary", type: "submit", id: "pull-button" }, "Pull"));
    this.progress = el("div", { id: "pulls" });
    box.append(el("h2", {}, "Pull a model"), form, this.progress);
    this.drawProgress();
  },
  drawProgress() {
    if (!this.progress) return;
    this.progress.replaceChildren(...Object.entries(state.pulls).map(([name, p]) => {
      const pct = p.total ? Math.min(100, (100 * (p.completed || 0)) / p.total) : p.done && !p.error ? 100 : 0;
      return el("div", { class: "section pull", "data-pull": name, "data-status": p.error ? "error" : p.done ? "done" : "running" },
        el("div", { class: "row", style: "justify-content:space-between" }, el("strong", {}, name),
          el("span", { class: p.error ? "error-text" : "muted", "data-pull-status": "" },
            p.error || `${p.status || "starting"}${p.total ? ` — ${bytes(p.completed || 0)} of ${bytes(p.total)}` : ""}`)),
        el("div", { class: "bar blue", style: "margin-top:6px" }, el("div", { style: `width:${pct}%` })));
    }));
  },
  update(snap) {
    if (this.pullBox.hidden === isAdmin()) this.drawPull();
    const models = snap.models || [];
    if (same(this, models.map((m) => ({ ...m, rss_bytes: m.rss_bytes && Math.round(m.rss_bytes / 1e7), expires_at: m.expires_at && Math.round(m.expires_at / 10) })),
      isAdmin(), Array.from(state.armed))) return;
    if (!models.length) {
      this.table.replaceChildren(el("div", { class: "card" }, empty("No model installed",
        isAdmin() ? "Pull one above by name, or run `blazar pull smollm2` in a terminal." : "Ask the operator to pull one.")));
      return;
    }
    const admin = isAdmin();
    this.table.replaceChildren(el("div", { class: "card table-card" }, el("table", { id: "models-table" },
      el("thead", {}, el("tr", {}, ["Model", "Size", "Quant", "Context", "Capabilities", "Source", "State",
        "Memory (est. / RSS)", "Keep-alive", admin ? "" : null].filter((t) => t !== null).map((t) => el("th", {}, t)))),
      el("tbody", {}, models.map((m) => el("tr", { "data-model": m.name },
        el("td", {}, el("strong", {}, m.name)),
        el("td", {}, bytes(m.size_bytes)),
        el("td", {}, m.quant || "—"),
        el("td", {}, m.ctx_train ? m.ctx_train.toLocaleString() : "—"),
        el("td", { class: "wrap" }, (m.capabilities || []).map((c) => el("span", { class: "tag" }, c))),
        el("td", { class: "muted" }, m.source || "—"),
        el("td", {}, m.loaded ? pill(m.state || "loaded") : el("span", { class: "muted" }, "not loaded")),
        el("td", { class: "wrap" }, m.loaded ? `${bytes(m.memory_bytes)} / ${bytes(m.rss_bytes)}` : "—"),
        el("td", {}, m.loaded ? until(m.expires_at) : "—"),
        admin ? el("td", {}, el("div", { class: "actions" },
          m.loaded
            ? el("button", { "data-action": "unload", onclick: () => act(`unload ${m.name}`, "POST", `/admin/models/${encodeURIComponent(m.name)}/unload`) }, "Unload")
            : el("button", { "data-action": "load", onclick: () => act(`load ${m.name}`, "POST", "/api/generate", { model: m.name, stream: false }) }, "Load"),
          removeButton(m.name))) : null))))));
  },
};

function removeButton(name) {
  const armed = state.armed.has(name);
  const redraw = () => { if (state.view === "models" && state.snap) { VIEWS.models.drawn = null; VIEWS.models.update(state.snap); } };
  return el("button", { class: "danger", "data-action": armed ? "confirm-remove" : "remove", onclick: () => {
    if (armed) { state.armed.delete(name); act(`remove ${name}`, "DELETE", "/api/delete", { model: name }); redraw(); return; }
    state.armed.add(name);
    setTimeout(() => { state.armed.delete(name); redraw(); }, 4000);
    redraw();
  } }, armed ? "Confirm remove" : "Remove");
}

async function pull(name) {
  const p = (state.pulls[name] = { status: "starting", completed: 0, total: 0, done: false, error: null });
  const redraw = () => { if (state.view === "models") VIEWS.models.drawProgress(); };
  redraw();
  try {
    const resp = await call("POST", "/api/pull", { model: name, stream: true });
    if (!resp.ok) { p.error = await failure(resp); p.done = true; redraw(); return; }
    for await (const line of linesOf(resp)) {
      const doc = JSON.parse(line);
      if (doc.error) { p.error = doc.error; continue; }
      p.status = doc.status || p.status;
      if (doc.total) { p.total = doc.total; p.completed = doc.completed || 0; }
      if (doc.status === "success") { p.done = true; p.completed = p.total; }
      redraw();
    }
    p.done = true;
    if (!p.error) flash(`pulled ${name}`, true);
  } catch (err) {
    p.error = err.message;
    p.done = true;
  }
  redraw();
}

/** The non-empty lines of a streamed answer (NDJSON or SSE), trimmed, as they arrive. */
async function* linesOf(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, cut).trim();
      buf = buf.slice(cut + 1);
      if (line) yield line;
    }
  }
}

// -- Requests ----------------------------------------------------------

VIEWS.requests = {
  title: "Requests",
  mount(root) {
    this.live = el("div", { id: "live-requests" });
    this.classes = el("div", { id: "classes" });
    this.classView = {};
    this.recent = el("div", { id: "recent-requests" });
    this.story = el("div", { id: "why" });
    this.grid = this.body = null;
    root.append(el("h2", {}, "Live"), this.live, el("div", { class: "section" }, this.story),
      el("div", { class: "section" }, el("h2", {}, "Classes"), this.classes),
      el("div", { class: "section" }, el("h2", {}, "Recently finished"), this.recent));
    this.drawWhy();
  },
  // Cards and rows are kept by request id and trace id and only their changing fields are
  // rewritten, so a snapshot with many requests in flight costs the page little.
  update(snap) {
    const admin = isAdmin();
    if (this.admin !== admin) { this.cards = new Map(); this.rows = new Map(); this.admin = admin; }
    const live = snap.requests || [];
    if (!live.length) {
      this.cards.clear();
      this.live.replaceChildren(el("div", { class: "card" }, empty("Nothing running right now",
        "Requests appear here as they arrive — try the Playground.")));
    } else {
      const seen = new Set();
      const nodes = live.map((r) => {
        seen.add(r.id);
        let card = this.cards.get(r.id);
        if (!card) { card = this.card(r, admin); this.cards.set(r.id, card); }
        card.node.dataset.state = r.state;
        set(card.state, pill(r.state));
        set(card.queue, r.queue_position === null || r.queue_position === undefined ? "—" : String(r.queue_position));
        set(card.klass, (r.class || "—") + (r.preempted ? ` (preempted ×${r.preempted})` : ""));
        set(card.chunks, String(r.chunks));
        set(card.ttft, ms(r.ttft_ms));
        set(card.elapsed, ms(r.elapsed_ms));
        return card.node;
      });
      for (const id of [...this.cards.keys()]) if (!seen.has(id)) this.cards.delete(id);
      if (!this.grid || !this.grid.isConnected) this.live.replaceChildren(this.grid = el("div", { class: "reqs" }));
      this.grid.replaceChildren(...nodes);
    }
    this.drawClasses(snap.classes || []);
    const recent = snap.recent || [];
    if (!recent.length) {
      this.rows.clear();
      this.recent.replaceChildren(el("div", { class: "card" }, empty("No finished request yet", "Finished requests are listed here, newest first.")));
      return;
    }
    const keep = new Map();
    const trs = recent.map((r) => {
      let row = this.rows.get(r.trace_id);
      if (!row) {
        const when = el("td", { class: "muted" });
        row = { when, node: el("tr", { "data-trace": r.trace_id },
          when, el("td", {}, r.model || "—"), el("td", {}, el("code", {}, r.path)),
          el("td", {}, pill(r.state)), el("td", {}, r.status ?? "—"), el("td", {}, ms(r.ttft_ms)), el("td", {}, ms(r.elapsed_ms)),
          el("td", {}, admin ? el("button", { "data-action": "why", onclick: () => why(r.trace_id) }, "Why?") : null)) };
      }
      set(row.when, ago(r.created_at));
      keep.set(r.trace_id, row);
      return row.node;
    });
    this.rows = keep;
    if (!this.body || !this.body.isConnected) {
      this.body = el("tbody");
      this.recent.replaceChildren(el("div", { class: "card table-card" }, el("table", {},
        el("thead", {}, el("tr", {}, ["When", "Model", "Route", "Outcome", "Status", "TTFT", "Duration", ""].map((t) => el("th", {}, t)))),
        this.body)));
    }
    this.body.replaceChildren(...trs);
  },
  card(r, admin) {
    const dd = () => el("dd");
    const c = { state: el("span"), queue: dd(), klass: dd(), chunks: dd(), ttft: dd(), elapsed: dd() };
    c.node = el("div", { class: "card req", "data-request": r.id, "data-state": r.state },
      el("div", { class: "top" }, el("strong", {}, r.model || "—"), c.state),
      el("dl", {},
        el("dt", {}, "Route"), el("dd", {}, el("code", {}, r.path)),
        el("dt", {}, "Queue position"), c.queue,
        el("dt", {}, "Class"), c.klass,
        el("dt", {}, "Chunks so far"), c.chunks,
        el("dt", {}, "Time to first token"), c.ttft,
        el("dt", {}, "Elapsed"), c.elapsed,
        el("dt", {}, "Trace"), el("dd", {}, el("code", {}, r.trace_id))),
      admin ? el("div", { class: "actions" },
        el("button", { "data-action": "interrupt", onclick: () => act("interrupt", "POST", `/v1/requests/${r.id}/interrupt`) }, "Interrupt"),
        el("button", { class: "danger", "data-action": "cancel", onclick: () => act("cancel", "POST", `/v1/requests/${r.id}/cancel`) }, "Cancel")) : null);
    return c;
  },
  // Admission's request classes (docs/scheduling.md): an admin sees them, others an empty list.
  drawClasses(classes) {
    if (same(this.classView, classes)) return;
    if (!classes.length) {
      this.classes.replaceChildren(el("div", { class: "card" }, empty("No class figures", "An admin key sees each request class's queue, waits and preemptions.")));
      return;
    }
    this.classes.replaceChildren(el("div", { class: "card table-card" }, el("table", {},
      el("thead", {}, el("tr", {}, ["Class", "Queued", "Running", "Granted", "Mean wait", "Queue full", "Timed out", "Preempted"].map((t) => el("th", {}, t)))),
      el("tbody", {}, classes.map((c) => el("tr", { "data-class": c.name },
        el("td", {}, c.name), ...[c.queued, c.running, c.granted].map((n) => el("td", {}, String(n))),
        el("td", {}, ms(c.mean_wait_ms)), ...[c.rejected, c.expired, c.preempted].map((n) => el("td", {}, String(n)))))))));
  },
  drawWhy() {
    if (!this.story) return;
    const w = state.why;
    if (!w) { this.story.replaceChildren(); return; }
    this.story.replaceChildren(el("div", { class: "card", "data-story": w.trace_id },
      el("div", { class: "chart-head" }, el("h2", {}, `Why: ${w.trace_id}`),
        el("button", { onclick: () => { state.why = null; this.drawWhy(); } }, "Close")),
      w.error ? el("p", { class: "error-text" }, w.error)
        : el("ul", {}, (w.lines || []).map((l) => el("li", {}, l)))));
  },
};

async function why(traceId) {
  try {
    const resp = await call("GET", `/api/why/${encodeURIComponent(traceId)}`);
    state.why = resp.ok ? await resp.json() : { trace_id: traceId, error: await failure(resp) };
  } catch (err) {
    state.why = { trace_id: traceId, error: err.message };
  }
  if (state.view === "requests") VIEWS.requests.drawWhy();
}

// -- Engines -----------------------------------------------------------

VIEWS.engines = {
  title: "Engines",
  mount(root) {
    this.root = el("div");
    this.peers = el("div", { id: "peers" });
    this.peerView = {};
    root.append(this.root, this.peers);
    this.open = new Set();
  },
  update(snap) {
    this.drawPeers(snap.peers || []);
    const loaded = (snap.models || []).filter((m) => m.loaded || m.pid || m.last_error);
    if (same(this, loaded.map((m) => [m.name, m.engine, m.lane, m.engine_version, m.state, m.pid, m.port, m.busy,
      m.slots, m.ctx_per_slot, m.restarts, m.breaker, m.last_error, m.stderr_tail]))) return;
    if (!loaded.length) {
      this.root.replaceChildren(el("div", { class: "card" }, empty("No engine is running",
        "Each loaded model runs in its own engine process; one starts with the model's first request.")));
      return;
    }
    const breaker = (m) => m.breaker === "open"
      ? el("span", { class: "pill bad" }, `open · retry in ${Math.ceil(m.breaker_retry_after_s || 0)} s`)
      : el("span", { class: "pill ok" }, m.breaker || "closed");
    this.root.replaceChildren(el("div", { class: "reqs", id: "engines" }, loaded.map((m) => {
      const tail = m.stderr_tail
        ? el("details", { class: "stderr", open: this.open.has(m.name),
          ontoggle: (ev) => { if (ev.target.open) this.open.add(m.name); else this.open.delete(m.name); } },
          el("summary", {}, "stderr tail"), el("pre", {}, m.stderr_tail))
        : null;
      return el("div", { class: "card req engine", "data-model": m.name },
        el("div", { class: "top" }, el("strong", {}, m.name), pill(m.state)),
        el("dl", {},
          el("dt", {}, "Lane"), el("dd", {}, m.lane || "—", m.engine ? el("span", { class: "muted" }, ` · ${m.engine}`) : null),
          el("dt", {}, "Version"), el("dd", {}, el("code", {}, m.engine_version || "—")),
          el("dt", {}, "PID · port"), el("dd", {}, el("code", {}, `${m.pid ?? "—"} · ${m.port ?? "—"}`)),
          el("dt", {}, "Slots busy"), el("dd", {}, `${m.busy ?? 0} / ${m.slots ?? "—"}`),
          el("dt", {}, "Context / slot"), el("dd", {}, m.ctx_per_slot ? m.ctx_per_slot.toLocaleString() : "—"),
          el("dt", {}, "Restarts"), el("dd", {}, String(m.restarts ?? 0)),
          el("dt", {}, "Breaker"), el("dd", { class: "breaker" }, breaker(m)),
          el("dt", {}, "Last error"), el("dd", { class: m.last_error ? "error-text" : "muted" }, m.last_error || "none")),
        tail);
    })));
  },
  // The [[remotes]] peers and pool routers (docs/federation.md), as last polled: a router's
  // workers as it lists them, and for one started here its process and the workers given to it.
  drawPeers(peers) {
    if (same(this.peerView, peers)) return;
    if (!peers.length) { this.peers.replaceChildren(); return; }
    const workers = (p) => !p.workers ? null : el("table", { class: "workers" },
      el("thead", {}, el("tr", {}, ["Worker", "Model", "Health", "Status", "Load"].map((t) => el("th", {}, t)))),
      el("tbody", {}, p.workers.map((w) => el("tr", { "data-worker": w.url },
        el("td", {}, el("code", {}, w.url)), el("td", {}, w.model || "—"),
        el("td", {}, el("span", { class: `pill ${w.healthy ? "ok" : "bad"}` }, w.healthy ? "healthy" : "unhealthy")),
        el("td", {}, w.status || "—"), el("td", {}, w.load ?? "—")))));
    this.peers.replaceChildren(el("h2", {}, "Peers and pools"), el("div", { class: "reqs" }, peers.map((p) =>
      el("div", { class: "card req peer", "data-peer": p.name },
        el("div", { class: "top" }, el("strong", {}, p.name), pill(p.state)),
        el("dl", {},
          el("dt", {}, "Kind"), el("dd", {}, p.pool ? `pool router (${p.pool})` : (p.kind || "—")),
          el("dt", {}, "URL"), el("dd", {}, el("code", {}, p.url)),
          p.router ? el("dt", {}, "Router here") : null,
          p.router ? el("dd", {}, `${p.router.state} · pid ${p.router.pid ?? "—"} · restarts ${p.router.restarts}`) : null,
          el("dt", {}, "Loaded"), el("dd", {}, p.loaded.length ? p.loaded.join(", ") : "—"),
          el("dt", {}, "Last error"), el("dd", { class: p.last_error ? "error-text" : "muted" }, p.last_error || "none")),
        workers(p)))));
  },
};

// -- Compute -----------------------------------------------------------

VIEWS.compute = {
  title: "Compute",
  mount(root) {
    this.root = el("div");
    this.planner = el("div", { class: "section", id: "planner" });
    root.append(this.root, this.planner);
    this.chosen = null; // models ticked for the together check (null: the loaded ones)
    this.plans = {};
    this.planKey = null;
    this.together = null;
  },
  update(snap) {
    this.updatePlanner(snap);
    const mem = snap.memory;
    const loaded = (snap.models || []).filter((m) => m.loaded);
    const parts = [];
    const meter = (label, used, total, extra) => el("div", { class: "card" },
      el("div", { class: "chart-head" }, el("h2", {}, label), el("span", { class: "muted" }, `${bytes(used)} used of ${bytes(total)}`)),
      el("div", { class: "bar" }, el("div", { style: `width:${total ? (100 * used) / total : 0}%` })), extra || null);
    if (mem) {
      parts.push(meter("System memory", mem.total_bytes - mem.available_bytes, mem.total_bytes,
        el("p", { class: "muted" }, `${bytes(mem.available_bytes)} available`,
          mem.budget_bytes ? ` · model budget ${bytes(mem.budget_bytes)}` : "")));
      for (const g of mem.gpus || []) parts.push(meter(`GPU · ${g.name}`, g.total_bytes - g.free_bytes, g.total_bytes));
      if (!(mem.gpus || []).length) parts.push(el("div", { class: "card" }, el("h2", {}, "GPUs"),
        el("p", { class: "muted" }, "No GPU found: models run on the CPU.")));
    } else {
      parts.push(el("div", { class: "card" }, empty("No memory census", "This daemon does not report its memory.")));
    }
    const takes = loaded.length
      ? el("div", { class: "card table-card" }, el("table", {},
        el("thead", {}, el("tr", {}, ["Model", "Planned", "Measured RSS", "Share of budget"].map((t) => el("th", {}, t)))),
        el("tbody", {}, loaded.map((m) => {
          const budget = mem && (mem.budget_bytes || mem.total_bytes);
          const share = budget && m.memory_bytes ? (100 * m.memory_bytes) / budget : 0;
          return el("tr", { "data-model": m.name }, el("td", {}, el("strong", {}, m.name)), el("td", {}, bytes(m.memory_bytes)),
            el("td", {}, bytes(m.rss_bytes)),
            el("td", { style: "width:35%" }, el("div", { class: "bar" }, el("div", { style: `width:${share}%` }))));
        }))))
      : el("div", { class: "card" }, empty("Nothing loaded", "What each loaded model takes is shown here."));
    this.root.replaceChildren(el("div", { class: "grid wide" }, parts),
      el("div", { class: "section" }, el("h2", {}, "What each loaded model takes"), takes));
  },
  // What each installed model would do if loaded now (GET /api/plan/NAME), and whether a chosen
  // set fits together (GET /api/coreside). Fetched when the installed or loaded set changes.
  updatePlanner(snap) {
    const models = snap.models || [];
    const key = JSON.stringify(models.map((m) => [m.name, m.loaded]));
    if (this.chosen === null) this.chosen = new Set(models.filter((m) => m.loaded).map((m) => m.name));
    if (key === this.planKey) return;
    this.planKey = key;
    this.models = models;
    Promise.all(models.map(async (m) => {
      try {
        const resp = await call("GET", `/api/plan/${encodeURIComponent(m.name)}`);
        this.plans[m.name] = resp.ok ? await resp.json() : { error: await failure(resp) };
      } catch (err) { this.plans[m.name] = { error: err.message }; }
    })).then(() => { if (this.planKey === key) this.drawPlanner(); });
    this.drawPlanner();
  },
  drawPlanner() {
    const models = this.models || [];
    const decision = (m) => {
      const plan = this.plans[m.name];
      if (m.loaded) return el("span", { class: "pill ok" }, "loaded");
      if (!plan) return el("span", { class: "muted" }, "…");
      if (plan.error) return el("span", { class: "error-text" }, plan.error);
      const p = plan.preview || {};
      if (p.refused && p.code === "MODEL_UNSUPPORTED_ENGINE") return el("span", { class: "pill bad", title: p.refused }, "no engine here");
      if (p.refused) return el("span", { class: "pill bad", title: p.refused }, `won't fit · ${p.code}`);
      if ((p.evict || []).length) return el("span", { class: "pill warn" }, `fits after unloading ${p.evict.join(", ")}`);
      return el("span", { class: "pill ok" }, "fits now");
    };
    const need = (m) => { const p = this.plans[m.name]; return p && p.estimate ? bytes(p.estimate.total) : "—"; };
    const rows = models.map((m) => el("tr", { "data-model": m.name },
      el("td", {}, el("input", { type: "checkbox", "data-pick": m.name, checked: this.chosen.has(m.name),
        onchange: (ev) => { if (ev.target.checked) this.chosen.add(m.name); else this.chosen.delete(m.name); } })),
      el("td", {}, el("strong", {}, m.name)),
      el("td", { class: "muted" }, (() => { const p = this.plans[m.name]; return p && p.ctx_per_slot ? `${p.ctx_per_slot.toLocaleString()} × ${p.slots}` : "—"; })()),
      el("td", {}, need(m)), el("td", { "data-fit": m.name }, decision(m))));
    const result = this.drawTogether();
    this.planner.replaceChildren(el("h2", {}, "What would fit"),
      models.length ? el("div", { class: "card table-card" }, el("table", { id: "fit-table" },
        el("thead", {}, el("tr", {}, ["", "Model", "Context × slots", "Needs", "If loaded now"].map((t) => el("th", {}, t)))),
        el("tbody", {}, rows)))
        : el("div", { class: "card" }, empty("No model installed", "Pull one from the Models view.")),
      models.length ? el("div", { class: "card together" },
        el("div", { class: "chart-head" }, el("h2", {}, "Together"),
          el("button", { id: "coreside-check", onclick: () => this.checkTogether() }, "Check the ticked models together")),
        result) : null);
  },
  async checkTogether() {
    const names = [...this.chosen];
    if (!names.length) { this.together = { error: "tick at least one model" }; this.drawPlanner(); return; }
    const q = names.map((n) => `model=${encodeURIComponent(n)}`).join("&");
    try {
      const resp = await call("GET", `/api/coreside?${q}`);
      this.together = resp.ok ? await resp.json() : { error: await failure(resp) };
    } catch (err) { this.together = { error: err.message }; }
    this.drawPlanner();
  },
  drawTogether() {
    const t = this.together;
    if (!t) return el("p", { class: "muted" }, "Tick models above to see whether they fit in memory at once, each at the context and slots it runs with.");
    if (t.error) return el("p", { class: "error-text" }, t.error);
    const verdict = t.budget === null ? el("span", { class: "pill" }, "no memory check")
      : el("span", { class: `pill ${t.fits ? "ok" : "bad"}` }, t.fits ? "fit together" : "do not fit together");
    return el("div", { id: "coreside-result", "data-fits": String(t.fits) },
      el("p", {}, verdict, " ", `${bytes(t.total)} for ${t.models.map((m) => m.model).join(" + ")}`,
        t.budget !== null ? ` · budget ${bytes(t.budget)} (${t.budget_from}) · headroom ${bytes(t.headroom)}` : ""));
  },
};


// -- Jobs --------------------------------------------------------------

VIEWS.jobs = {
  title: "Jobs",
  mount(root) { this.root = el("div"); root.append(this.root); },
  update(snap) {
    const jobs = snap.jobs || [];
    if (same(this, jobs, isAdmin())) return;
    if (!jobs.length) {
      this.root.replaceChildren(el("div", { class: "card" }, empty("No job",
        "Background responses, batches and pulls show here with their progress.")));
      return;
    }
    const admin = isAdmin();
    const ended = new Set(["succeeded", "completed", "failed", "cancelled", "expired", "done"]);
    this.root.replaceChildren(el("div", { class: "card table-card" }, el("table", { id: "jobs-table" },
      el("thead", {}, el("tr", {}, ["Job", "Kind", "State", "Progress", "Created", "Detail", ""].map((t) => el("th", {}, t)))),
      el("tbody", {}, jobs.map((j) => el("tr", { "data-job": j.id },
        el("td", {}, el("code", {}, j.id)), el("td", {}, j.kind), el("td", {}, pill(j.state)),
        el("td", { style: "width:20%" }, j.progress === null || j.progress === undefined ? el("span", { class: "muted" }, "—")
          : el("div", { class: "bar blue" }, el("div", { style: `width:${100 * j.progress}%` }))),
        el("td", { class: "muted" }, ago(j.created_at)), el("td", { class: "muted" }, j.detail || ""),
        el("td", {}, el("div", { class: "actions" },
          (j.results || []).map((r) => el("button", { "data-action": "download", "data-result": r.label,
            onclick: () => download(r) }, `Download ${r.label}`)),
          admin && !ended.has(j.state) ? el("button", { class: "danger", "data-action": "cancel-job",
            onclick: () => act("cancel job", "POST", `/v1/jobs/${encodeURIComponent(j.id)}/cancel`) }, "Cancel") : null))))))));
  },
};

// -- Playground --------------------------------------------------------

const DIALECTS = {
  openai: { label: "OpenAI · /v1/chat/completions", path: "/v1/chat/completions",
    body: (model, messages, max) => ({ model, messages, stream: true, max_tokens: max }),
    sse: true, piece: (doc) => doc.choices && doc.choices[0] && doc.choices[0].delta && doc.choices[0].delta.content },
  anthropic: { label: "Anthropic · /v1/messages", path: "/v1/messages",
    body: (model, messages, max) => ({ model, messages, stream: true, max_tokens: max }),
    sse: true, piece: (doc) => doc.type === "content_block_delta" && doc.delta && doc.delta.text },
  ollama: { label: "Ollama · /api/chat", path: "/api/chat",
    body: (model, messages, max) => ({ model, messages, stream: true, options: { num_predict: max } }),
    sse: false, piece: (doc) => doc.message && doc.message.content },
};

const play = { messages: [], busy: false, stats: null };

VIEWS.playground = {
  title: "Playground",
  mount(root) {
    this.model = el("select", { id: "play-model" });
    this.dialect = el("select", { id: "play-dialect" },
      Object.entries(DIALECTS).map(([k, d]) => el("option", { value: k }, d.label)));
    this.log = el("div", { class: "chatlog", id: "play-log" });
    this.max = el("input", { id: "play-max", type: "number", min: "1", value: "256", style: "width:100%" });
    const input = el("textarea", { id: "play-input", placeholder: "Say something to the model… (Enter sends, Shift+Enter breaks the line)" });
    input.addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); } });
    const send = () => { const text = input.value.trim(); if (text && !play.busy) { input.value = ""; chat(this, text); } };
    this.send = el("button", { class: "primary", id: "play-send", onclick: send }, "Send");
    this.stats = el("dl", { class: "kv", id: "play-stats" });
    root.append(el("div", { class: "play" },
      el("div", { class: "card" }, this.log, el("div", { class: "composer" }, input, this.send)),
      el("div", { class: "card" }, el("h2", {}, "Settings"),
        el("label", { class: "muted" }, "Model"), el("div", {}, this.model),
        el("label", { class: "muted", style: "display:block;margin-top:10px" }, "Dialect"), el("div", {}, this.dialect),
        el("label", { class: "muted", style: "display:block;margin-top:10px" }, "Max tokens"), el("div", {}, this.max),
        el("div", { class: "row", style: "margin-top:10px" }, el("button", { onclick: () => { play.messages = []; play.stats = null; this.draw(); } }, "Clear chat")),
        el("h2", { style: "margin-top:18px" }, "Last answer"), this.stats)));
    for (const s of [this.model, this.dialect]) s.style.width = "100%";
    this.draw();
  },
  update(snap) {
    const names = (snap.models || []).map((m) => m.name);
    const have = Array.from(this.model.options).map((o) => o.value);
    if (names.join("\n") !== have.join("\n")) {
      const keep = this.model.value;
      this.model.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
      if (names.includes(keep)) this.model.value = keep;
    }
  },
  draw() {
    if (!this.log) return;
    if (!play.messages.length) {
      this.log.replaceChildren(empty("Start a conversation", "Pick a model and a dialect, then type below: the answer streams in as it is generated."));
    } else {
      this.log.replaceChildren(...play.messages.map((m) => el("div", { class: `msg ${m.role}` }, m.content || "…")));
      this.log.scrollTop = this.log.scrollHeight;
    }
    const s = play.stats;
    this.stats.replaceChildren(...(s ? [
      el("dt", {}, "Tokens/s"), el("dd", { id: "play-tps" }, num(s.tps)),
      el("dt", {}, "Chunks"), el("dd", {}, String(s.pieces)),
      el("dt", {}, "First token"), el("dd", {}, ms(s.ttft_ms)),
      el("dt", {}, "Trace id"), el("dd", { id: "play-trace" }, el("code", {}, s.trace || "—")),
    ] : [el("dt", {}, ""), el("dd", { class: "muted" }, "Send a message to see its speed and trace id.")]));
    this.send.disabled = play.busy;
  },
};

async function chat(view, text) {
  const model = view.model.value;
  if (!model) { flash("no model installed: pull one in Models first"); return; }
  const d = DIALECTS[view.dialect.value];
  play.messages.push({ role: "user", content: text });
  const answer = { role: "assistant", content: "" };
  const history = play.messages.filter((m) => m.role !== "error").map(({ role, content }) => ({ role, content }));
  play.messages.push(answer);
  play.busy = true;
  const t0 = performance.now();
  const stats = (play.stats = { tps: null, pieces: 0, ttft_ms: null, trace: null });
  const redraw = () => { if (state.view === "playground") VIEWS.playground.draw(); };
  redraw();
  let first = null;
  try {
    const resp = await call("POST", d.path, d.body(model, history, Math.max(1, Number(view.max.value) || 256)));
    stats.trace = resp.headers.get("x-blazar-trace-id");
    if (!resp.ok) throw new Error(await failure(resp));
    for await (let line of linesOf(resp)) {
      if (d.sse) { if (!line.startsWith("data:")) continue; line = line.slice(5).trim(); }
      if (!line || line === "[DONE]") continue;
      const doc = JSON.parse(line);
      if (doc.error) throw new Error(doc.error.message || doc.error);
      const piece = d.piece(doc);
      if (!piece) continue;
      const now = performance.now();
      if (first === null) { first = now; stats.ttft_ms = now - t0; }
      answer.content += piece;
      stats.pieces++;
      if (stats.pieces > 1) stats.tps = (stats.pieces - 1) / ((now - first) / 1000);
      redraw();
    }
  } catch (err) {
    play.messages.push({ role: "error", content: err.message });
  }
  play.busy = false;
  redraw();
}

// -- start -------------------------------------------------------------

document.getElementById("login-form").addEventListener("submit", () => {
  state.key = document.getElementById("login-key").value.trim();
  sessionStorage.setItem(KEY_STORE, state.key);
  setConn("wait", "connecting…");
  follow();
});
document.getElementById("signout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY_STORE);
  location.reload();
});
window.addEventListener("hashchange", () => show(location.hash.slice(1)));
show(location.hash.slice(1) || "dashboard");
follow();
