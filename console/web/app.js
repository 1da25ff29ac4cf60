// The Partita console's pages: plain JavaScript, no build step. Every number
// comes from the console's JSON API (/api/v1, documented at
// /api/v1/openapi.json); live changes come over /api/v1/events.
"use strict";

(function () {
  // ---- Authentication -----------------------------------------------------
  // Local mode: the URL `partita console` printed carries #token=...; it is
  // kept in this origin's localStorage (origins differ by port, so another
  // console, or another user's server on this machine, cannot read it) and
  // sent as a bearer token. Shared mode: the person pastes a Kubernetes token
  // on the sign-in page, or the authenticating proxy vouches for them.
  const TOKEN_KEY = "partita-console-token";
  (function takeTokenFromURL() {
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (m) {
      localStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
      history.replaceState(null, "", location.pathname + location.search);
    }
  })();
  const token = () => localStorage.getItem(TOKEN_KEY) || "";

  // Numbers the benchmark and the browser tests read.
  const metrics = (window.__partita = { firstRender: null, mapNodes: 0, updates: [], errors: [] });

  class APIError extends Error {
    constructor(status, body) {
      super((body && body.error && body.error.message) || "HTTP " + status);
      this.status = status;
      this.reason = body && body.error && body.error.reason;
    }
  }

  async function api(path, opts = {}) {
    const headers = Object.assign({ Accept: "application/json" }, opts.headers || {});
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    if (opts.body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, {
      method: opts.method || "GET",
      headers,
      body: opts.body !== undefined ? JSON.stringify(opts.body) : undefined,
      credentials: "same-origin",
    });
    let body = null;
    const text = await res.text();
    try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
    if (!res.ok) {
      const err = new APIError(res.status, body);
      if (res.status === 401) showSignIn(err.message);
      throw err;
    }
    return body;
  }

  // ---- DOM helpers ----------------------------------------------------------
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
      else if (k === "dataset") Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  const main = () => document.getElementById("main");
  // fill replaces el's children, skipping the empty ones (null, false).
  function fill(el, ...children) {
    el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false)
      .map((c) => (c instanceof Node ? c : document.createTextNode(String(c)))));
  }
  function setMain(...children) {
    fill(main(), ...children);
  }
  function errorBox(err) {
    return h("div", { class: "error", role: "alert" }, err.message || String(err));
  }
  function link(href, text) {
    return h("a", { href, "data-nav": true }, text);
  }

  // GPUs from milli-GPUs, as kubectl partita writes them: 0.25, 1, 7.5.
  function gpus(milli) {
    return (Math.round(milli) / 1000).toString();
  }
  function num(v, unit) {
    if (v === null || v === undefined) return "–";
    if (unit === "memory") return bytes(v);
    return (Math.round(v * 1000) / 1000).toString();
  }
  // hours writes resource-hours as kubectl partita queues does: whole from
  // 100, one decimal below, one significant digit below 0.1.
  function hours(v) {
    if (v === null || v === undefined) return "–";
    if (v >= 100) return Math.round(v).toString();
    if (v >= 0.1 || v === 0) return (Math.round(v * 10) / 10).toString();
    return Number(v.toPrecision(1)).toString();
  }
  function bytes(v) {
    if (v === -1) return "-1";
    const units = ["", "Ki", "Mi", "Gi", "Ti"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (Math.round(v * 10) / 10) + units[i];
  }
  function age(iso) {
    const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
    if (s < 120) return Math.round(s) + "s";
    if (s < 7200) return Math.round(s / 60) + "m";
    if (s < 172800) return Math.round(s / 3600) + "h";
    return Math.round(s / 86400) + "d";
  }
  // A stable colour per queue name, never red: red marks unhealthy GPUs.
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#3d5a80", "#86bc86", "#d4a6c8", "#e6a157", "#5fa2ce"];
  function queueColour(q) {
    if (!q) return "#8c95a8";
    let x = 2166136261;
    for (let i = 0; i < q.length; i++) { x ^= q.charCodeAt(i); x = Math.imul(x, 16777619) >>> 0; }
    return PALETTE[x % PALETTE.length];
  }

  // ---- Session --------------------------------------------------------------
  let me = null; // Whoami
  let mapState = null; // {version, nodes: Map(name -> node), ...}
  const listeners = { nodes: [], queues: [], workloads: [] };

  function showSignIn(message) {
    if (document.getElementById("signin")) return;
    const local = me ? me.mode === "local" : !location.protocol.startsWith("https");
    if (local) {
      setMain(h("div", { class: "card signin", id: "signin" },
        h("h1", {}, "This page needs the console's token"),
        h("p", {}, "Open the URL that ", h("code", {}, "partita console"), " printed when it started: it carries a token that lets your browser in, and keeps out other users of this machine."),
        h("p", { class: "muted" }, message)));
      return;
    }
    const ta = h("textarea", { id: "signin-token", placeholder: "eyJhbGciOi…" });
    setMain(h("div", { class: "card signin", id: "signin" },
      h("h1", {}, "Sign in"),
      h("p", {}, "Paste a Kubernetes token of yours (for example ", h("code", {}, "kubectl create token <serviceaccount>"), ", or your OIDC ID token). The console checks it with the API server and acts as you."),
      h("p", { class: "muted" }, message),
      ta,
      h("p", {}, h("button", { onclick: () => { localStorage.setItem(TOKEN_KEY, ta.value.trim()); location.reload(); } }, "Sign in"))));
  }

  // ---- Live updates ---------------------------------------------------------
  // Server-Sent Events read with fetch, so the bearer token goes in a header
  // (EventSource cannot send one).
  let streamAbort = null, streamTopics = "";
  function stopStream() {
    if (streamAbort) streamAbort.abort();
    streamAbort = null;
    streamTopics = "";
    setLive("", "");
  }
  function setLive(state, title) {
    const el = document.getElementById("live");
    el.hidden = !state;
    el.className = "live " + state;
    el.textContent = state === "on" ? "live" : state === "off" ? "offline" : "…";
    el.title = title || "";
  }
  // stream keeps one stream open for the page's topics; the map restarts it
  // from the version it read, the lists keep theirs.
  async function stream(since, topics) {
    if (streamAbort && streamTopics === topics && topics !== "nodes") return;
    if (streamAbort) streamAbort.abort();
    const ctl = new AbortController();
    streamAbort = ctl;
    streamTopics = topics;
    let backoff = 1000;
    for (;;) {
      try {
        const q = "?topics=" + topics + (since ? "&since=" + since : "");
        const res = await fetch("/api/v1/events" + q, {
          headers: { Authorization: "Bearer " + token(), Accept: "text/event-stream" },
          signal: ctl.signal,
        });
        if (!res.ok) throw new Error("HTTP " + res.status);
        setLive("on", "connected");
        backoff = 1000;
        const reader = res.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, i);
            buf = buf.slice(i + 2);
            let event = "message", data = "";
            for (const line of block.split("\n")) {
              if (line.startsWith("event: ")) event = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
            }
            if (data) dispatch(event, JSON.parse(data));
            if (event === "nodes") since = JSON.parse(data).version;
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
        metrics.errors.push(String(e));
      }
      setLive("off", "reconnecting");
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 15000);
    }
  }
  function dispatch(event, data) {
    if (event === "resync") { route(); return; }
    for (const f of listeners[event] || []) f(data);
  }
  function on(event, f) { listeners[event].push(f); }
  function clearListeners() { for (const k of Object.keys(listeners)) listeners[k] = []; }

  // Refetches a page at most once a second when its list changes.
  function throttled(f) {
    let timer = null;
    return () => { if (!timer) timer = setTimeout(() => { timer = null; f(); }, 1000); };
  }

  // ---- Workload map ---------------------------------------------------------
  const filters = { queue: "", namespace: "", node: "", model: "" };
  // What the map groups nodes by: "none", "key" (the console's
  // --topology-key label) or "topology:NAME" (a Topology's levels, nested);
  // null until the page picks its default.
  let grouping = null;

  async function viewMap() {
    setMain(h("h1", {}, "Workload map"), h("p", { class: "muted" }, "Loading the map…"));
    const t0 = performance.now();
    let m;
    try { m = await api("/api/v1/map"); } catch (e) { setMain(h("h1", {}, "Workload map"), errorBox(e)); return; }
    const t1 = performance.now();
    mapState = { version: m.version, topologyKey: m.topologyKey, topologies: m.topologies || [], nodes: new Map(), selected: null };
    for (const n of m.nodes) mapState.nodes.set(n.name, n);
    // The choice outlives the page; a Topology since deleted falls back.
    const choices = ["none"].concat(m.topologyKey ? ["key"] : [], mapState.topologies.map((t) => "topology:" + t.name));
    if (!choices.includes(grouping)) grouping = m.topologyKey ? "key" : "none";
    const sel = (name, values) => h("select", { onchange: (e) => { filters[name] = e.target.value; applyFilters(); }, "aria-label": name },
      h("option", { value: "" }, "all"), values.map((v) => h("option", { value: v, selected: filters[name] === v }, v)));
    const groupSel = h("select", { id: "map-grouping", "aria-label": "group by", onchange: (e) => { grouping = e.target.value; renderMap(); } },
      h("option", { value: "none", selected: grouping === "none" }, "nothing"),
      m.topologyKey ? h("option", { value: "key", selected: grouping === "key" }, "label " + m.topologyKey) : null,
      mapState.topologies.map((t) => h("option", { value: "topology:" + t.name, selected: grouping === "topology:" + t.name, title: t.levels.join(" › ") },
        "topology " + t.name)));
    const toolbar = h("div", { class: "toolbar" },
      h("label", {}, "Queue", sel("queue", m.queues)),
      h("label", {}, "Namespace", sel("namespace", m.namespaces)),
      h("label", {}, "Node", h("input", { type: "search", value: filters.node, placeholder: "name contains", oninput: (e) => { filters.node = e.target.value; applyFilters(); } })),
      h("label", {}, "GPU model", sel("model", m.models)),
      h("label", {}, "Group by", groupSel));
    const legend = h("div", { class: "legend", id: "legend" });
    const summary = h("div", { class: "summary", id: "summary" });
    const grid = h("div", { id: "map", class: "grow" });
    const detail = h("div", { class: "detail card", id: "detail" }, h("p", { class: "muted" }, "Hover over a GPU to see its pods; click it to keep them here."));
    setMain(h("h1", {}, "Workload map"), m.note ? h("div", { class: "note" }, m.note) : null, toolbar, summary, legend,
      h("div", { class: "layout" }, grid, detail));
    renderMap();
    metrics.firstRender = performance.now();
    metrics.mapFetchMs = t1 - t0;
    metrics.mapRenderMs = metrics.firstRender - t1;
    metrics.mapNodes = mapState.nodes.size;
    grid.addEventListener("mouseover", onCellHover);
    grid.addEventListener("mouseout", () => { document.getElementById("tooltip").hidden = true; });
    grid.addEventListener("click", onCellClick);
    on("nodes", onNodes);
    stream(m.version, "nodes");
  }

  function onNodes(ev) {
    if (!mapState) return;
    const t0 = performance.now();
    if (ev.full) mapState.nodes.clear();
    for (const name of ev.removed || []) mapState.nodes.delete(name);
    const changed = [];
    for (const n of ev.nodes) {
      const isNew = !mapState.nodes.has(n.name);
      mapState.nodes.set(n.name, n);
      changed.push(n.name);
      if (ev.full || isNew) continue;
      const old = document.querySelector('.node[data-node="' + CSS.escape(n.name) + '"]');
      if (old) old.replaceWith(nodeElement(n));
    }
    mapState.version = ev.version;
    // Grouped by a Topology, a change may move a node (its labels) and
    // changes its domains' numbers: draw the map again.
    if (ev.full || (ev.removed && ev.removed.length) || grouping.startsWith("topology:") ||
      changed.some((n) => !document.querySelector('.node[data-node="' + CSS.escape(n) + '"]'))) renderMap();
    else { applyFilters(); renderSummary(); }
    // What the benchmark reads: when the change reached the console, when
    // the console sent it, when this page showed it, and the pods now on
    // the nodes it redrew.
    const pods = [];
    if (!ev.full) for (const n of ev.nodes) for (const g of n.gpus) for (const s of g.slices) pods.push(s.namespace + "/" + s.pod);
    metrics.updates.push({ version: ev.version, changedAt: ev.changedAt, sentAt: ev.sentAt, renderedAt: Date.now(), handleMs: performance.now() - t0, nodes: changed.length, pods });
    if (metrics.updates.length > 1000) metrics.updates.shift();
    if (mapState.selected) showDetail(mapState.selected.node, mapState.selected.index, true);
  }

  function renderMap() {
    const grid = document.getElementById("map");
    if (!grid) return;
    const nodes = [...mapState.nodes.values()].sort((a, b) => a.name.localeCompare(b.name, undefined, { numeric: true }));
    let sections;
    const topology = grouping.startsWith("topology:") && mapState.topologies.find((t) => "topology:" + t.name === grouping);
    if (topology) {
      sections = groupByLevels(nodes, topology.levels).map((d) => domainSection(d, 0));
    } else if (grouping === "key") {
      const byDomain = new Map();
      for (const n of nodes) {
        const d = n.topology || "";
        if (!byDomain.has(d)) byDomain.set(d, []);
        byDomain.get(d).push(n);
      }
      const domains = [...byDomain.keys()].sort();
      sections = domains.map((d) => h("section", { class: "domain", dataset: { domain: d } },
        domains.length > 1 || d ? h("h2", {}, (mapState.topologyKey || "topology") + ": " + (d || "(none)")) : null,
        h("div", { class: "nodes" }, byDomain.get(d).map(nodeElement))));
    } else {
      sections = nodes.length ? [h("section", { class: "domain" }, h("div", { class: "nodes" }, nodes.map(nodeElement)))] : [];
    }
    if (!nodes.length) sections.push(h("p", { class: "muted" }, "No GPU nodes: no node runs Partita's agent yet."));
    fill(grid, sections);
    applyFilters();
    renderSummary();
  }

  // groupByLevels groups nodes by levels (node labels, broadest first) as
  // the API's domains do (report.GroupByLevels): a domain per value of the
  // first level, each split by the next, the nodes without the label last.
  // It works on the page's live nodes, so the map stays grouped as they
  // change.
  function groupByLevels(nodes, levels) {
    if (!levels.length) return [];
    const [level, ...rest] = levels;
    const byKey = new Map();
    for (const n of nodes) {
      const has = !!n.labels && Object.prototype.hasOwnProperty.call(n.labels, level);
      const key = has ? "=" + n.labels[level] : "missing";
      if (!byKey.has(key)) byKey.set(key, { level, value: has ? n.labels[level] : "", missing: !has, nodes: [] });
      byKey.get(key).nodes.push(n);
    }
    const domains = [...byKey.values()].sort((a, b) => (a.missing - b.missing) || (a.value < b.value ? -1 : a.value > b.value ? 1 : 0));
    for (const d of domains) d.domains = rest.length ? groupByLevels(d.nodes, rest) : null;
    return domains;
  }

  // domainSection is a domain headed by its level and value and its
  // nodes' free and total GPUs, holding the next level's domains or, at
  // the narrowest, its nodes.
  function domainSection(d, depth) {
    let total = 0, free = 0;
    for (const n of d.nodes) for (const g of n.gpus) { total++; free += g.freeMilli; }
    const name = d.missing ? "(no " + d.level + ")" : d.level + "=" + d.value;
    const dataset = { level: d.level, value: d.value };
    if (d.missing) dataset.missing = "true";
    return h("section", { class: "domain nested", dataset },
      h("h" + Math.min(2 + depth, 6), { class: "domain-head" }, h("span", { class: "domain-name" }, name),
        h("span", { class: "domain-gpus" }, d.nodes.length + (d.nodes.length === 1 ? " node · " : " nodes · ") + gpus(free) + " / " + total + " GPUs free")),
      d.domains ? d.domains.map((c) => domainSection(c, depth + 1)) : h("div", { class: "nodes" }, d.nodes.map(nodeElement)));
  }

  function nodeElement(n) {
    return h("div", { class: "node", dataset: { node: n.name } },
      h("header", {}, h("span", { class: "name", title: n.name }, n.name), h("span", { class: "badge " + n.isolation, title: "isolation mode" }, n.isolation)),
      h("div", { class: "gpus" }, n.gpus.map((g) => gpuElement(n, g))));
  }

  function gpuElement(n, g) {
    const cls = ["gpu"];
    if (!g.healthy) cls.push("unhealthy");
    if (g.health === "MIG") cls.push("mig");
    const parts = g.slices.map((s) => h("div", {
      class: "slice", style: { width: (s.milli / 10) + "%", background: queueColour(s.queue) },
      dataset: { pod: s.namespace + "/" + s.pod, queue: s.queue || "", namespace: s.namespace },
    }));
    if (g.hiddenMilli > 0) parts.push(h("div", { class: "slice hidden", style: { width: (g.hiddenMilli / 10) + "%" }, dataset: { hidden: g.hiddenMilli } }));
    return h("div", { class: cls.join(" "), dataset: { node: n.name, gpu: g.index, model: g.model, health: g.health } },
      h("span", { class: "idx" }, g.index), parts);
  }

  function renderSummary() {
    const el = document.getElementById("summary");
    if (!el) return;
    let total = 0, healthy = 0, used = 0, pods = new Set();
    for (const n of mapState.nodes.values()) for (const g of n.gpus) {
      total++; if (g.healthy) healthy++; used += g.usedMilli;
      for (const s of g.slices) pods.add(s.namespace + "/" + s.pod);
    }
    fill(el,
      h("span", {}, h("b", {}, mapState.nodes.size), " nodes"),
      h("span", {}, h("b", {}, total), " GPUs (", healthy, " healthy)"),
      h("span", {}, h("b", {}, gpus(used)), " GPUs allocated (", total ? Math.round(used / total / 10) : 0, "%)"),
      h("span", {}, h("b", {}, pods.size), " pods holding GPUs"));
    const queues = new Set();
    let hidden = false;
    for (const n of mapState.nodes.values()) for (const g of n.gpus) {
      for (const s of g.slices) queues.add(s.queue || "");
      if (g.hiddenMilli > 0) hidden = true;
    }
    const lg = document.getElementById("legend");
    fill(lg, ...[...queues].sort().map((q) => h("span", {}, h("i", { class: "swatch", style: { background: queueColour(q) } }), q || "(no queue)")),
      hidden ? h("span", {}, h("i", { class: "swatch hidden-slices" }), "other namespaces (hidden)") : null,
      h("span", {}, h("i", { class: "swatch", style: { background: "var(--free)", border: "1px solid #cfd5e0" } }), "free"),
      h("span", { class: "bad" }, "red: unhealthy"));
  }

  // The same filters as the API's: nodes by name and GPU model; nodes holding
  // a slice of the queue or namespace, with the other slices dimmed.
  function applyFilters() {
    for (const el of document.querySelectorAll("#map .node")) {
      const n = mapState.nodes.get(el.dataset.node);
      if (!n) continue;
      let show = !filters.node || n.name.includes(filters.node);
      if (show && filters.model) show = n.gpus.some((g) => g.model === filters.model);
      const match = (s) => (!filters.queue || s.queue === filters.queue) && (!filters.namespace || s.namespace === filters.namespace);
      if (show && (filters.queue || filters.namespace)) show = n.gpus.some((g) => g.slices.some(match));
      el.classList.toggle("filtered", !show);
      for (const s of el.querySelectorAll(".slice[data-pod]")) {
        const ok = (!filters.queue || s.dataset.queue === filters.queue) && (!filters.namespace || s.dataset.namespace === filters.namespace);
        s.classList.toggle("dim", !ok);
      }
    }
  }

  function cellOf(target) {
    const el = target.closest && target.closest(".gpu");
    if (!el) return null;
    const n = mapState.nodes.get(el.dataset.node);
    if (!n) return null;
    const g = n.gpus.find((x) => String(x.index) === el.dataset.gpu);
    return g ? { el, n, g } : null;
  }
  function describeSlice(s) {
    const amount = s.whole ? "whole GPU" : s.byMemory ? bytes(s.memoryMiB * 1048576) + " (" + gpus(s.milli) + ")" : gpus(s.milli) + " of the GPU";
    return s.namespace + "/" + s.pod + (s.container && s.container !== "main" ? ":" + s.container : "") + " — " + amount + (s.queue ? " · queue " + s.queue : "");
  }
  function onCellHover(e) {
    const c = cellOf(e.target);
    const tip = document.getElementById("tooltip");
    if (!c) { tip.hidden = true; return; }
    const lines = [c.n.name + " GPU " + c.g.index + " · " + c.g.model + " · " + c.g.health + " · " + gpus(c.g.usedMilli) + " used"];
    for (const s of c.g.slices) lines.push(describeSlice(s));
    if (c.g.hiddenMilli) lines.push(gpus(c.g.hiddenMilli) + " held by pods you may not see");
    if (!c.g.slices.length && !c.g.hiddenMilli) lines.push("free");
    tip.replaceChildren(...lines.map((l) => h("div", {}, l)));
    tip.hidden = false;
    const r = c.el.getBoundingClientRect();
    tip.style.left = Math.min(r.left, window.innerWidth - 390) + "px";
    tip.style.top = (r.bottom + 6) + "px";
  }
  function onCellClick(e) {
    const c = cellOf(e.target);
    if (!c) return;
    showDetail(c.n.name, c.g.index, false);
  }
  function showDetail(nodeName, index, refresh) {
    const n = mapState.nodes.get(nodeName);
    const g = n && n.gpus.find((x) => x.index === index);
    const panel = document.getElementById("detail");
    if (!g || !panel) return;
    mapState.selected = { node: nodeName, index };
    for (const el of document.querySelectorAll(".gpu.selected")) el.classList.remove("selected");
    const cell = document.querySelector('.gpu[data-node="' + CSS.escape(nodeName) + '"][data-gpu="' + index + '"]');
    if (cell) cell.classList.add("selected");
    fill(panel,
      h("h2", {}, nodeName + " · GPU " + g.index),
      h("dl", { class: "kv" },
        h("dt", {}, "Model"), h("dd", {}, g.model + " (" + bytes(g.memoryMiB * 1048576) + ")"),
        h("dt", {}, "Health"), h("dd", { class: g.healthy ? "ok" : "bad" }, g.health),
        h("dt", {}, "Isolation"), h("dd", {}, n.isolation),
        n.enforcement ? [h("dt", {}, "Enforced by"), h("dd", { title: n.enforcement.dmem && n.enforcement.dmem.reason || "" },
          (n.enforcement.containerPath || "?") + " · memory: " + (n.enforcement.memoryCap || "?"))] : null,
        h("dt", {}, "Used / free"), h("dd", {}, gpus(g.usedMilli) + " / " + gpus(g.freeMilli)),
        h("dt", {}, "UUID"), h("dd", { class: "mono" }, g.uuid)),
      h("h2", {}, "Slices"),
      g.slices.length ? h("table", { class: "list" }, h("tbody", {}, g.slices.map((s) => h("tr", {},
        h("td", {}, h("i", { class: "swatch", style: { background: queueColour(s.queue) } })),
        h("td", {}, link("/workloads/" + s.workload.kind + "/" + s.workload.namespace + "/" + s.workload.name, s.namespace + "/" + s.pod),
          h("div", { class: "muted" }, s.whole ? "whole GPU" : s.byMemory ? bytes(s.memoryMiB * 1048576) : gpus(s.milli), s.queue ? " · " + s.queue : "")))))) : h("p", { class: "muted" }, g.hiddenMilli ? "" : "Nothing runs here."),
      g.hiddenMilli ? h("p", { class: "muted" }, gpus(g.hiddenMilli) + " held by pods in namespaces you may not see.") : null);
    if (!refresh) panel.scrollIntoView({ block: "nearest" });
  }

  // ---- Queues -----------------------------------------------------------------
  let queueResource = "gpu";
  async function viewQueues() {
    let qs;
    try { qs = await api("/api/v1/queues"); } catch (e) { setMain(h("h1", {}, "Queues"), errorBox(e)); return; }
    const unit = queueResource;
    const scaleOf = (q) => {
      const r = q.resources[unit];
      return Math.max(r.limit > 0 ? r.limit : 0, r.quota > 0 ? r.quota : 0, r.allocated || 0, r.fairShare || 0, r.requested || 0);
    };
    // Usage shows only where the admission loop weighs it in fair share.
    const known = (v) => v !== null && v !== undefined;
    const usage = qs.queues.some((q) => known(q.resources[unit].usageHours));
    const windows = [...new Set(qs.queues.map((q) => q.usageWindow).filter(Boolean))];
    let scale = Math.max(1, ...qs.queues.map(scaleOf));
    if (unit === "gpu" && qs.capacityGPUs) scale = Math.max(scale, qs.capacityGPUs);
    const pct = (v) => Math.max(0, Math.min(100, (v / scale) * 100)) + "%";
    const tabs = h("div", { class: "toolbar" }, ["gpu", "cpu", "memory"].map((r) =>
      h("button", { class: r === unit ? "" : "secondary", onclick: () => { queueResource = r; viewQueues(); } }, r)),
      h("span", { class: "spacer" }),
      me.can.createQueues ? h("button", { id: "new-queue", onclick: () => queueForm(null, qs.queues) }, "New queue") : null);
    const rows = qs.queues.map((q) => {
      const r = q.resources[unit];
      const alloc = r.allocated || 0;
      const bar = h("div", { class: "bar", title: "allocated " + num(r.allocated, unit) + ", quota " + num(r.quota, unit) + ", fair share " + num(r.fairShare, unit) + ", limit " + (r.limit === -1 ? "none" : num(r.limit, unit)) },
        h("div", { class: "fill", style: { width: pct(alloc), background: queueColour(q.name) } }),
        r.borrowed > 0 ? h("div", { class: "borrowed", style: { left: pct(alloc - r.borrowed), width: pct(r.borrowed) } }) : null,
        r.pending > 0 ? h("div", { class: "pending", style: { left: pct(alloc), width: pct(r.pending) } }) : null,
        r.quota >= 0 ? h("div", { class: "mark quota", style: { left: pct(r.quota) } }) : null,
        r.fairShare !== null && r.fairShare !== undefined ? h("div", { class: "mark fair", style: { left: pct(r.fairShare) } }) : null,
        r.limit >= 0 ? h("div", { class: "mark limit", style: { left: pct(r.limit) } }) : null);
      return h("tr", { dataset: { queue: q.name } },
        h("td", { class: "qname", style: { paddingLeft: (8 + q.depth * 18) + "px" } }, h("i", { class: "swatch", style: { background: queueColour(q.name) } }), " ", q.name,
          q.leaf ? "" : h("span", { class: "muted" }, " (parent)"), q.note ? h("div", { class: "bad" }, q.note) : null),
        h("td", { class: "num" }, q.priority),
        h("td", {}, bar),
        h("td", { class: "num", dataset: { field: "quota" } }, r.quota === -1 ? "all" : num(r.quota, unit)),
        h("td", { class: "num", dataset: { field: "limit" } }, r.limit === -1 ? "none" : num(r.limit, unit)),
        h("td", { class: "num" }, r.overQuotaWeight),
        h("td", { class: "num" }, num(r.allocated, unit)),
        h("td", { class: "num", dataset: { field: "fairShare" } }, num(r.fairShare, unit),
          known(r.fairShareWithoutUsage) && known(r.fairShare) && r.fairShareWithoutUsage !== r.fairShare ?
            h("div", { class: "muted without-usage", title: "history decided: past usage changed the fair share" }, num(r.fairShareWithoutUsage, unit) + " without usage") : null),
        usage ? h("td", { class: "num", dataset: { field: "usage" }, title: known(r.usageShare) ? Math.round(r.usageShare * 1000) / 10 + "% of the cluster's capacity over the window" : null },
          unit === "memory" ? num(r.usageHours, unit) : hours(r.usageHours)) : null,
        h("td", { class: "num" }, num(r.requested, unit)),
        h("td", { class: "num" }, num(r.pending, unit)),
        h("td", { class: "num" + (r.borrowed > 0 ? " warn" : "") }, num(r.borrowed, unit)),
        h("td", { class: "num" + (r.reclaimable > 0 ? " bad" : "") }, num(r.reclaimable, unit)),
        h("td", { class: "num", style: { whiteSpace: "nowrap" }, title: "running / admitted / gated pods" }, q.running + " / " + q.admitted + " / " + q.gated),
        h("td", { class: "actions" }, me.can.updateQueues ? h("button", { class: "secondary", "data-action": "edit", onclick: () => queueForm(q, qs.queues) }, "Edit") : null));
    });
    setMain(h("h1", {}, "Queues"), tabs,
      h("div", { class: "barkey" },
        h("span", {}, h("i", { style: { background: "#6b86d6" } }), "allocated"),
        h("span", {}, h("i", { style: { background: "repeating-linear-gradient(45deg,#6b86d6,#6b86d6 2px,#fff 2px,#fff 4px)" } }), "borrowed (above quota)"),
        h("span", {}, h("i", { style: { border: "1.5px dashed #7a8296" } }), "pending"),
        h("span", {}, h("i", { style: { background: "#1d2330", width: "2px" } }), "quota"),
        h("span", {}, h("i", { style: { background: "#3257d6", width: "2px" } }), "fair share"),
        h("span", {}, h("i", { style: { background: "#c62f3a", width: "2px" } }), "limit"),
        h("span", {}, "Reclaimable: allocated above fair share, which reclaim takes back when a queue below its fair share waits.")),
      qs.queues.length ? h("table", { class: "list", id: "queues" },
        h("thead", {}, h("tr", {}, ["Queue", "Priority", unit === "gpu" ? "GPUs" : unit, "Quota", "Limit", "Weight", "Allocated", "Fair share",
          usage ? "Usage" : null, "Requested", "Pending", "Borrowed", "Reclaimable", "Pods", ""]
          .filter((t) => t !== null).map((t, i, all) => h("th", { class: i >= 3 && i < all.length - 1 ? "num" : "" }, t)))),
        h("tbody", {}, rows)) : h("p", { class: "muted" }, "No queues."),
      usage && windows.length ? h("p", { class: "muted", id: "usage-window" }, "Usage: the " + { gpu: "GPU", cpu: "core", memory: "byte" }[unit] + "-hours each queue (a parent with its children) used in the " + windows.join("; ") +
        ". Where it changed a queue's fair share, the fair share without usage shows under it.") : null);
    on("queues", throttled(viewQueuesIfShown));
    stream(null, "queues");
  }
  function viewQueuesIfShown() {
    if (location.pathname === "/queues" && !document.querySelector("dialog[open]")) viewQueues();
  }

  function queueForm(q, all) {
    const dlg = document.getElementById("dialog");
    const creating = !q;
    const res = ["gpu", "cpu", "memory"];
    const field = (name, value, attrs) => h("input", Object.assign({ name, value: value === undefined || value === null ? "" : value }, attrs || {}));
    const rv = (r, k) => {
      if (!q || !q.resources[r].set) return "";
      const v = q.resources[r][k];
      return r === "memory" && k !== "overQuotaWeight" && v !== -1 ? Math.round(v) : v;
    };
    const err = h("div");
    const form = h("form", { class: "grid", method: "dialog" },
      h("h2", { class: "full" }, creating ? "New queue" : "Edit queue " + q.name),
      creating ? [h("label", { for: "q-name" }, "Name"), field("name", "", { id: "q-name", required: true, pattern: "[a-z0-9]([-a-z0-9.]*[a-z0-9])?" })] : null,
      h("label", {}, "Parent"), h("select", { name: "parent" }, h("option", { value: "" }, "(top level)"),
        all.filter((x) => !q || x.name !== q.name).map((x) => h("option", { value: x.name, selected: q && q.parent === x.name }, x.name))),
      h("label", {}, "Priority"), field("priority", q ? q.priority : 100, { type: "number" }),
      h("label", {}, "Namespaces"), field("namespaces", q && q.namespaces ? q.namespaces.join(", ") : "", { placeholder: "team-a, team-b (empty: every namespace)" }),
      res.map((r) => h("fieldset", {}, h("legend", {}, r + (r === "memory" ? " (bytes, or 64Gi)" : r === "cpu" ? " (cores)" : " (GPUs)")),
        h("span", {}, ""), h("span", { class: "muted" }, "quota"), h("span", { class: "muted" }, "limit (-1: none)"), h("span", { class: "muted" }, "over-quota weight"),
        h("span", {}, r),
        field(r + ".quota", rv(r, "quota"), { "aria-label": r + " quota" }),
        field(r + ".limit", rv(r, "limit"), { "aria-label": r + " limit" }),
        field(r + ".overQuotaWeight", rv(r, "overQuotaWeight"), { type: "number", min: 0, "aria-label": r + " over-quota weight" }))),
      h("div", { class: "full" }, err),
      h("div", { class: "buttons" },
        h("button", { type: "button", class: "secondary", onclick: () => dlg.close() }, "Cancel"),
        h("button", { type: "submit", id: "queue-save" }, creating ? "Create" : "Save")));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const fd = new FormData(form);
      const body = { resources: {} };
      if (creating) body.name = fd.get("name");
      else body.resourceVersion = q.resourceVersion;
      body.parent = fd.get("parent");
      const pr = fd.get("priority");
      if (pr !== "") body.priority = parseInt(pr, 10);
      const nss = String(fd.get("namespaces")).split(",").map((s) => s.trim()).filter(Boolean);
      if (creating ? nss.length : true) body.namespaces = nss;
      for (const r of res) {
        const x = {};
        const qv = String(fd.get(r + ".quota")).trim(), lv = String(fd.get(r + ".limit")).trim(), wv = String(fd.get(r + ".overQuotaWeight")).trim();
        if (qv !== "") x.quota = qv;
        if (lv !== "") x.limit = lv;
        if (wv !== "") x.overQuotaWeight = parseInt(wv, 10);
        if (Object.keys(x).length) body.resources[r] = x;
      }
      try {
        if (creating) await api("/api/v1/queues", { method: "POST", body });
        else await api("/api/v1/queues/" + encodeURIComponent(q.name), { method: "PATCH", body });
        dlg.close();
        setTimeout(viewQueues, 300);
      } catch (ex) {
        err.replaceChildren(errorBox(ex));
      }
    });
    dlg.replaceChildren(form);
    dlg.showModal();
  }

  // ---- Workloads ----------------------------------------------------------------
  const wlFilters = { namespace: "", queue: "", phase: "", text: "" };
  async function viewWorkloads() {
    let wl;
    try { wl = await api("/api/v1/workloads"); } catch (e) { setMain(h("h1", {}, "Workloads"), errorBox(e)); return; }
    const uniq = (f) => [...new Set(wl.workloads.map(f).filter(Boolean))].sort();
    const sel = (name, values) => h("select", { "aria-label": name, onchange: (e) => { wlFilters[name] = e.target.value; filter(); } },
      h("option", { value: "" }, "all"), values.map((v) => h("option", { value: v, selected: wlFilters[name] === v }, v)));
    const submittable = me.namespaces.filter((n) => n.submit);
    const toolbar = h("div", { class: "toolbar" },
      h("label", {}, "Namespace", sel("namespace", uniq((w) => w.namespace))),
      h("label", {}, "Queue", sel("queue", uniq((w) => w.queue))),
      h("label", {}, "Phase", sel("phase", uniq((w) => w.phase))),
      h("label", {}, "Name", h("input", { type: "search", value: wlFilters.text, oninput: (e) => { wlFilters.text = e.target.value; filter(); } })),
      h("span", { class: "spacer" }),
      submittable.length ? h("button", { id: "new-workload", onclick: () => submitForm(submittable) }, "New workload") : null);
    // The waiting ones first: they are what people come to look at.
    const order = { Waiting: 0, Running: 1, Suspended: 2, Failed: 3, Succeeded: 4 };
    wl.workloads.sort((a, b) => (order[a.phase] ?? 5) - (order[b.phase] ?? 5));
    const rows = wl.workloads.map((w) => {
      const href = "/workloads/" + w.kind + "/" + w.namespace + "/" + w.name;
      return h("tr", { dataset: { workload: w.kind + "/" + w.namespace + "/" + w.name, namespace: w.namespace, queue: w.queue || "", phase: w.phase } },
        h("td", {}, w.kind),
        h("td", {}, link(href, w.namespace + "/" + w.name), w.gang ? h("div", { class: "muted" }, "gang " + w.gang + (w.minMember ? " (min " + w.minMember + ")" : "")) : null),
        h("td", {}, w.queue || h("span", { class: "muted" }, "–")),
        h("td", {}, h("span", { class: "phase " + w.phase }, w.phase)),
        h("td", { class: "num" }, gpus(w.requestedMilli)),
        h("td", { class: "num" }, gpus(w.heldMilli)),
        h("td", { class: "num" }, w.bound + "/" + w.pods + (w.finished ? " (+" + w.finished + " done)" : "")),
        h("td", { class: "num" }, age(w.created)),
        h("td", { class: "verdict" }, w.verdict ? link("/pods/" + w.namespace + "/" + w.waitingPod, w.verdict) : ""),
        h("td", { class: "actions" }, actionButtons(w, () => viewWorkloads())));
    });
    setMain(h("h1", {}, "Workloads"), wl.note ? h("div", { class: "note" }, wl.note) : null, toolbar,
      wl.workloads.length ? h("table", { class: "list", id: "workloads" },
        h("thead", {}, h("tr", {}, ["Kind", "Workload", "Queue", "Phase", "GPUs asked", "GPUs held", "Pods bound", "Age", "Why it waits", ""].map((t, i) => h("th", { class: i >= 4 && i <= 7 ? "num" : "" }, t)))),
        h("tbody", {}, rows)) : h("p", { class: "muted" }, "No workloads you may see."));
    function filter() {
      for (const tr of document.querySelectorAll("#workloads tbody tr")) {
        const d = tr.dataset;
        const ok = (!wlFilters.namespace || d.namespace === wlFilters.namespace) && (!wlFilters.queue || d.queue === wlFilters.queue) &&
          (!wlFilters.phase || d.phase === wlFilters.phase) && (!wlFilters.text || d.workload.includes(wlFilters.text));
        tr.hidden = !ok;
      }
    }
    filter();
    on("workloads", throttled(() => { if (location.pathname === "/workloads" && !document.querySelector("dialog[open]")) viewWorkloads(); }));
    stream(null, "workloads");
  }

  function actionButtons(w, after) {
    const out = [];
    const path = "/api/v1/workloads/" + encodeURIComponent(w.kind) + "/" + encodeURIComponent(w.namespace) + "/" + encodeURIComponent(w.name);
    const act = async (btn, method, suffix, confirmText) => {
      if (confirmText && !confirm(confirmText)) return;
      btn.disabled = true;
      try { await api(path + suffix, { method }); setTimeout(after, 300); } catch (e) { alert(e.message); btn.disabled = false; }
    };
    if (w.actions.includes("suspend")) out.push(h("button", { class: "secondary", "data-action": "suspend", onclick: (e) => act(e.target, "POST", "/suspend") }, "Suspend"));
    if (w.actions.includes("resume")) out.push(h("button", { class: "secondary", "data-action": "resume", onclick: (e) => act(e.target, "POST", "/resume") }, "Resume"));
    if (w.actions.includes("delete")) out.push(h("button", { class: "danger", "data-action": "delete", onclick: (e) => act(e.target, "DELETE", "", "Delete " + w.kind + " " + w.namespace + "/" + w.name + "?") }, "Delete"));
    return out;
  }

  function submitForm(namespaces) {
    const dlg = document.getElementById("dialog");
    const err = h("div");
    const def = namespaces.some((n) => n.name === me.defaultNamespace) ? me.defaultNamespace : namespaces[0].name;
    const form = h("form", { class: "grid" },
      h("h2", { class: "full" }, "New workload"),
      h("p", { class: "full muted" }, "One pod with one container: a quick way to get a notebook-sized slice of a GPU. It is made as you, and the webhook checks it as any pod."),
      h("label", {}, "Namespace"), h("select", { name: "namespace" }, namespaces.map((n) => h("option", { value: n.name, selected: n.name === def }, n.name))),
      h("label", {}, "Name"), h("input", { name: "name", placeholder: "(generated)" }),
      h("label", {}, "Image"), h("input", { name: "image", required: true, value: "jupyter/base-notebook:latest" }),
      h("label", {}, "Command"), h("input", { name: "command", placeholder: "e.g. sleep infinity (empty: the image's)" }),
      h("label", {}, "GPU"), h("div", { style: { display: "flex", gap: "6px" } },
        h("select", { name: "kind" }, h("option", { value: "fraction" }, "fraction of a GPU"), h("option", { value: "memory" }, "GPU memory"), h("option", { value: "gpus" }, "whole GPUs")),
        h("input", { name: "amount", value: "0.25", "aria-label": "amount" })),
      h("label", {}, "Queue"), h("input", { name: "queue", placeholder: "(the namespace's default)" }),
      h("div", { class: "full" }, err),
      h("div", { class: "buttons" },
        h("button", { type: "button", class: "secondary", onclick: () => dlg.close() }, "Cancel"),
        h("button", { type: "submit", id: "submit-workload" }, "Submit")));
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const fd = new FormData(form);
      const body = { namespace: fd.get("namespace"), image: fd.get("image") };
      if (fd.get("name")) body.name = fd.get("name");
      const cmd = String(fd.get("command")).trim();
      if (cmd) body.command = ["sh", "-c", cmd];
      if (fd.get("queue")) body.queue = fd.get("queue");
      const amount = String(fd.get("amount")).trim();
      if (fd.get("kind") === "fraction") body.gpuFraction = amount;
      else if (fd.get("kind") === "memory") body.gpuMemory = amount;
      else body.gpus = parseInt(amount, 10);
      try {
        const r = await api("/api/v1/workloads", { method: "POST", body });
        dlg.close();
        navigate("/workloads/Pod/" + r.namespace + "/" + r.pod);
      } catch (ex) { err.replaceChildren(errorBox(ex)); }
    });
    dlg.replaceChildren(form);
    dlg.showModal();
  }

  function whyTable(rep) {
    return [
      h("p", { class: "why-summary", id: "why-summary" }, rep.summary),
      h("table", { class: "list", id: "why" },
        h("thead", {}, h("tr", {}, h("th", {}, "Status"), h("th", {}, "Check"), h("th", {}, "Finding"))),
        h("tbody", {}, rep.findings.map((f) => h("tr", {},
          h("td", { class: "status-" + f.status }, f.status), h("td", {}, f.check), h("td", {}, f.message)))))];
  }

  async function viewWorkload(kind, ns, name) {
    let d;
    try { d = await api("/api/v1/workloads/" + encodeURIComponent(kind) + "/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name)); } catch (e) {
      setMain(h("h1", {}, kind + " " + ns + "/" + name), errorBox(e)); return;
    }
    const w = d.workload;
    setMain(
      h("p", {}, link("/workloads", "← Workloads")),
      h("h1", {}, w.kind + " " + w.namespace + "/" + w.name, " ", h("span", { class: "phase " + w.phase }, w.phase)),
      h("div", { class: "card" }, h("dl", { class: "kv" },
        h("dt", {}, "Queue"), h("dd", {}, w.queue || "–"),
        h("dt", {}, "Gang"), h("dd", {}, w.gang ? w.gang + (w.minMember ? " (minMember " + w.minMember + ")" : "") : "–"),
        h("dt", {}, "GPUs asked / held"), h("dd", {}, gpus(w.requestedMilli) + " / " + gpus(w.heldMilli)),
        h("dt", {}, "Pods bound"), h("dd", {}, w.bound + " of " + w.pods + (w.finished ? ", " + w.finished + " finished" : "")),
        h("dt", {}, "Age"), h("dd", {}, age(w.created))),
        h("p", {}, actionButtons(w, () => route()))),
      d.why ? [h("h2", {}, "Why " + d.why.pod + " waits"), whyTable(d.why)] : null,
      h("h2", {}, "Pods"),
      h("table", { class: "list", id: "members" },
        h("thead", {}, h("tr", {}, ["Pod", "Phase", "Node", "Devices", "GPUs asked", "Admission"].map((t) => h("th", {}, t)))),
        h("tbody", {}, d.members.map((m) => h("tr", { dataset: { pod: m.name } },
          h("td", {}, link("/pods/" + w.namespace + "/" + m.name, m.name)),
          h("td", {}, m.phase),
          h("td", {}, m.node || "–"),
          h("td", { class: "mono" }, m.devices.map((x) => (d.members.length && x.container !== "main" ? x.container + ": " : "") + "GPU " + x.indexes.join(",") + " (" + (x.milli === 1000 ? "whole" : gpus(x.milli)) + ")").join("; ") || "–"),
          h("td", { class: "num" }, gpus(m.requestedMilli)),
          h("td", { class: "muted" }, m.gated ? "gated" + (m.admitted ? ": " + m.admitted : "") : m.admitted || ""))))),
      h("h2", {}, "Events"),
      d.events.length ? h("table", { class: "list", id: "events" },
        h("thead", {}, h("tr", {}, ["Age", "Object", "Type", "Reason", "From", "Message"].map((t) => h("th", {}, t)))),
        h("tbody", {}, d.events.map((e) => h("tr", {},
          h("td", {}, age(e.time)), h("td", {}, e.object), h("td", { class: e.type === "Warning" ? "warn" : "" }, e.type),
          h("td", {}, e.reason + (e.count > 1 ? " ×" + e.count : "")), h("td", { class: "muted" }, e.source), h("td", {}, e.message))))) : h("p", { class: "muted" }, "No events (or you may not list events here)."));
    on("workloads", throttled(() => { if (location.pathname.startsWith("/workloads/")) route(); }));
    stream(null, "workloads");
  }

  async function viewPod(ns, name) {
    stopStream();
    let rep;
    try { rep = await api("/api/v1/pods/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name) + "/why"); } catch (e) {
      setMain(h("h1", {}, "Pod " + ns + "/" + name), errorBox(e)); return;
    }
    setMain(h("p", {}, link("/workloads", "← Workloads")), h("h1", {}, "Pod " + ns + "/" + name),
      h("p", { class: "muted" }, "The same checks as ", h("code", {}, "kubectl partita why " + name + " -n " + ns), ", from the same code."),
      whyTable(rep));
  }

  // ---- Utilisation ----------------------------------------------------------------
  let utilRange = new URLSearchParams(location.search).get("range") || "1h";
  const charts = [];
  async function viewUtilization() {
    stopStream();
    let u;
    try { u = await api("/api/v1/utilization?range=" + utilRange); } catch (e) { setMain(h("h1", {}, "Utilisation"), errorBox(e)); return; }
    const ranges = ["15m", "1h", "6h", "24h", "7d"];
    const c1 = h("div", { class: "chart", id: "chart-share" }, h("h2", {}, "Allocated share of the GPUs"));
    const c2 = h("div", { class: "chart", id: "chart-queues" }, h("h2", {}, "GPUs held, per queue"));
    setMain(h("h1", {}, "Utilisation"),
      h("div", { class: "toolbar" }, ranges.map((r) => h("button", { class: r === utilRange ? "" : "secondary", onclick: () => { utilRange = r; viewUtilization(); } }, r)),
        h("span", { class: "muted" }, "source: " + u.source)),
      u.note ? h("p", { class: "muted" }, u.note) : null,
      h("div", { class: "charts" }, c1, c2));
    while (charts.length) charts.pop().destroy();
    if (!window.uPlot) { c1.append(errorBox(new Error("the plotting library did not load"))); return; }
    const width = Math.max(400, main().clientWidth - 40);
    if (!u.times.length) { c1.append(h("p", { class: "muted" }, "No samples yet.")); return; }
    const x = { time: true, range: [u.from, u.to] };
    charts.push(new uPlot({
      width, height: 240,
      scales: { x, y: { range: [0, 100] } },
      series: [{}, { label: "allocated %", stroke: "#3257d6", fill: "rgba(50,87,214,.12)", value: (s, v) => v === null ? "–" : v.toFixed(1) + "%" }],
      axes: [{}, { values: (s, t) => t.map((v) => v + "%") }],
    }, [u.times, u.share.map((v) => v === null ? null : v * 100)], c1));
    const series = [{}, { label: "capacity", stroke: "#1d2330", dash: [6, 4] }];
    const data = [u.times, u.capacityGPUs];
    for (const q of u.queues) { series.push({ label: q.queue, stroke: queueColour(q.queue), width: 2 }); data.push(q.gpus); }
    charts.push(new uPlot({ width, height: 300, series, scales: { x, y: { range: (s, mn, mx) => [0, Math.max(1, mx)] } } }, data, c2));
  }

  // ---- Policy -------------------------------------------------------------------
  async function viewPolicy() {
    stopStream();
    let p;
    try { p = await api("/api/v1/policy"); } catch (e) { setMain(h("h1", {}, "Policy"), errorBox(e)); return; }
    const maxCount = Math.max(1, ...p.denials.map((d) => d.count));
    setMain(h("h1", {}, "Policy"),
      h("div", { class: "card" }, h("dl", { class: "kv" },
        h("dt", {}, "Version in force"), h("dd", { class: "mono", id: "policy-version" }, p.version || "–"),
        h("dt", {}, "Source"), h("dd", { class: "mono" }, p.source || "–"),
        h("dt", {}, "Last reload"), h("dd", { id: "policy-reload" }, p.lastReload ? [h("span", { class: p.lastReload.outcome === "Loaded" ? "ok" : "bad" }, p.lastReload.outcome), " ", age(p.lastReload.time) + " ago (ConfigMap " + p.lastReload.configMap + "): ", p.lastReload.message] : h("span", { class: "muted" }, "no reload event (the default policy, or the events have expired)")))),
      p.configMaps.length ? [h("h2", {}, "Policy ConfigMaps"), h("table", { class: "list" },
        h("thead", {}, h("tr", {}, h("th", {}, "ConfigMap"), h("th", {}, "Status (partita.dev/policy-status)"))),
        h("tbody", {}, p.configMaps.map((c) => h("tr", {}, h("td", {}, c.name), h("td", { class: c.status.startsWith("Refused") ? "bad" : "" }, c.status || "–")))))] : null,
      h("h2", {}, "Denials by reason"),
      h("p", { class: "muted" }, p.denialsSource || ""),
      p.denialsError ? h("div", { class: "note" }, p.denialsError) : null,
      p.denials.length ? h("table", { class: "list", id: "denials" },
        h("thead", {}, h("tr", {}, h("th", {}, "Reason"), h("th", { class: "num" }, "Refused"), h("th", {}, ""))),
        h("tbody", {}, p.denials.map((d) => h("tr", {}, h("td", {}, d.reason), h("td", { class: "num" }, d.count),
          h("td", {}, h("div", { class: "bar" }, h("div", { class: "fill", style: { width: (d.count / maxCount * 100) + "%", background: "#c62f3a" } }))))))) : h("p", { class: "muted" }, "No denials."));
  }

  // ---- Models: where each is held or fetched, who uses it ----------------------
  async function viewModels() {
    stopStream();
    let r;
    try { r = await api("/api/v1/models"); } catch (e) { setMain(h("h1", {}, "Models"), errorBox(e)); return; }
    const models = r.models || [];
    if (!models.length) {
      setMain(h("h1", {}, "Models"), h("p", { class: "muted" }, "No models you may list. A pod asks for one with the annotation partita.dev/model (docs/models.md)."));
      return;
    }
    const count = (m, phases) => m.nodes.filter((n) => phases.includes(n.phase)).length;
    const pods = (m, phase) => ((m.pods || {})[phase] || []);
    const held = (n) => n.total > 0 ? bytes(n.bytes) + " of " + bytes(n.total) + " (" + Math.round(100 * n.bytes / n.total) + "%)" : (n.bytes ? bytes(n.bytes) : "–");
    setMain(h("h1", {}, "Models"),
      h("table", { class: "list", id: "models" },
        h("thead", {}, h("tr", {}, h("th", {}, "Namespace"), h("th", {}, "Model"), h("th", {}, "Phase"), h("th", { class: "num" }, "Size"),
          h("th", { class: "num" }, "Nodes ready"), h("th", { class: "num" }, "Fetching"), h("th", { class: "num" }, "Failed"),
          h("th", { class: "num" }, "Pods running"), h("th", { class: "num" }, "Waiting"), h("th", {}, "Source"))),
        h("tbody", {}, models.map((m) => h("tr", { "data-model": m.namespace + "/" + m.name },
          h("td", {}, m.namespace), h("td", {}, m.name),
          h("td", { class: m.phase === "Ready" ? "ok" : m.phase === "Failed" ? "bad" : "" }, m.phase),
          h("td", { class: "num" }, m.size ? bytes(m.size) : "–"),
          h("td", { class: "num" }, count(m, ["Ready"])), h("td", { class: "num" }, count(m, ["Fetching", "Pending"])), h("td", { class: "num" }, count(m, ["Failed"])),
          h("td", { class: "num" }, pods(m, "Running").length), h("td", { class: "num" }, pods(m, "Pending").length),
          h("td", { class: "mono" }, m.source))))),
      models.map((m) => h("section", { class: "card", id: "model-" + m.namespace + "-" + m.name },
        h("h2", {}, m.namespace + "/" + m.name), m.message ? h("p", {}, m.message) : null,
        m.nodes.length ? h("table", { class: "list" },
          h("thead", {}, h("tr", {}, h("th", {}, "Node"), h("th", {}, "Phase"), h("th", {}, "Held"), h("th", {}, "Progress"), h("th", {}, "Message"))),
          h("tbody", {}, m.nodes.map((n) => h("tr", {},
            h("td", {}, n.name), h("td", { class: n.phase === "Ready" ? "ok" : n.phase === "Failed" ? "bad" : "" }, n.phase), h("td", {}, held(n)),
            h("td", {}, h("div", { class: "bar" }, h("div", { class: "fill", style: { width: (n.total > 0 ? 100 * n.bytes / n.total : 0) + "%", background: n.phase === "Failed" ? "#c62f3a" : "#2f7d4f" } }))),
            h("td", {}, n.message || ""))))) : h("p", { class: "muted" }, "No node holds or fetches it yet."),
        pods(m, "Running").length || pods(m, "Pending").length ? h("p", {},
          pods(m, "Running").length ? ["Running: ", pods(m, "Running").map((p) => link("/pods/" + encodeURIComponent(m.namespace) + "/" + encodeURIComponent(p), p)).reduce((a, b) => [a, ", ", b])] : null,
          pods(m, "Running").length && pods(m, "Pending").length ? " · " : null,
          pods(m, "Pending").length ? ["Waiting: ", pods(m, "Pending").map((p) => link("/pods/" + encodeURIComponent(m.namespace) + "/" + encodeURIComponent(p), p)).reduce((a, b) => [a, ", ", b])] : null) : null)));
  }

  // ---- Routing ------------------------------------------------------------------
  function navigate(path) {
    history.pushState(null, "", path);
    route();
  }
  document.addEventListener("click", (e) => {
    const a = e.target.closest && e.target.closest("a[data-nav]");
    if (!a || e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
    e.preventDefault();
    navigate(a.getAttribute("href"));
  });
  window.addEventListener("popstate", route);

  async function route() {
    clearListeners();
    mapState = null;
    const p = location.pathname;
    for (const a of document.querySelectorAll("header nav a")) {
      const page = a.dataset.page;
      a.classList.toggle("active", (page === "map" && p === "/") || (page !== "map" && p.startsWith("/" + page)));
    }
    let m;
    if (p === "/") return viewMap();
    if (p === "/queues") return viewQueues();
    if (p === "/workloads") return viewWorkloads();
    if ((m = /^\/workloads\/([^/]+)\/([^/]+)\/([^/]+)$/.exec(p))) return viewWorkload(...m.slice(1).map(decodeURIComponent));
    if ((m = /^\/pods\/([^/]+)\/([^/]+)$/.exec(p))) return viewPod(...m.slice(1).map(decodeURIComponent));
    if (p === "/utilization") return viewUtilization();
    if (p === "/policy") return viewPolicy();
    if (p === "/models") return viewModels();
    setMain(h("h1", {}, "Not found"), h("p", {}, link("/", "The workload map")));
  }

  async function start() {
    try {
      me = await api("/api/v1/whoami");
    } catch (e) {
      if (e.status !== 401) setMain(errorBox(e));
      return;
    }
    document.getElementById("who").textContent = me.user.name + (me.mode === "local" ? " (your kubeconfig)" : "");
    route();
  }
  start();
})();
