// The operators' page of the lock state: reads /locks.json for the
// current page (a cursor of LOCKS) 200 ms after its last read ended,
// counts each validity down between reads, and never holds a token (the
// JSON has none).
"use strict";
(function () {
  const POLL_MS = 200;
  const state = { cursor: "0", history: [], match: "", count: "100", data: null, fetchedAt: 0, failures: 0 };
  const $ = (id) => document.getElementById(id);

  function params() {
    const u = new URLSearchParams(location.hash.slice(1));
    state.match = u.get("match") || "";
    $("match").value = state.match;
    if (u.get("count")) { state.count = u.get("count"); $("count").value = state.count; }
  }

  function saveHash() {
    const u = new URLSearchParams();
    if (state.match) u.set("match", state.match);
    if (state.count !== "100") u.set("count", state.count);
    history.replaceState(null, "", u.toString() ? "#" + u.toString() : location.pathname);
  }

  function cell(tr, text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function fmtValidity(ms) {
    if (ms < 0) return "–";
    if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + (s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  function renderNodes(nodes) {
    const body = $("nodes").tBodies[0];
    body.replaceChildren();
    for (const n of nodes) {
      const tr = document.createElement("tr");
      tr.dataset.node = String(n.index);
      cell(tr, String(n.index));
      cell(tr, n.addr, "addr");
      cell(tr, n.state, "state state-" + n.state.replace(/ /g, "-"));
      cell(tr, n.rtt_ms < 0 ? "–" : n.rtt_ms.toFixed(2) + " ms", "num rtt");
      let why = n.reason || "";
      if (n.until) why += (why ? "; " : "") + "counts again by " + n.until;
      cell(tr, why, "muted");
      body.appendChild(tr);
    }
  }

  function renderLocks(d) {
    const body = $("locks").tBodies[0];
    body.replaceChildren();
    for (const l of d.locks) {
      const tr = document.createElement("tr");
      tr.dataset.resource = l.resource;
      cell(tr, l.resource, "resource");
      cell(tr, l.mode, "mode mode-" + l.mode);
      cell(tr, l.holder || "–", "holder");
      cell(tr, String(l.fence), "num fence");
      const v = cell(tr, "", "num validity");
      v.dataset.ms = String(l.validity_ms);
      cell(tr, String(l.holders), "num holders");
      cell(tr, String(l.holds), "num holds");
      cell(tr, String(l.permits), "num permits");
      cell(tr, String(l.waiters), "num waiters" + (l.waiters > 0 ? " some" : ""));
      body.appendChild(tr);
    }
    $("empty").hidden = d.locks.length > 0 || !!d.error;
    const page = state.history.length + 1;
    $("pageinfo").textContent = "page " + page + ", " + d.locks.length + " shown" + (d.next === "0" ? " (last page)" : "");
    $("next").disabled = d.next === "0";
    $("first").disabled = state.cursor === "0";
    tick();
  }

  // tick counts every validity down from the last poll.
  function tick() {
    const gone = Date.now() - state.fetchedAt;
    for (const td of document.querySelectorAll("#locks td.validity")) {
      const ms = Number(td.dataset.ms);
      const left = ms < 0 ? -1 : Math.max(0, ms - gone);
      td.dataset.left = String(left);
      td.textContent = fmtValidity(left);
    }
  }

  async function poll() {
    const u = new URLSearchParams({ cursor: state.cursor, count: state.count });
    if (state.match) u.set("match", state.match);
    try {
      const r = await fetch("/locks.json?" + u.toString(), { cache: "no-store" });
      const d = await r.json();
      state.data = d;
      state.fetchedAt = Date.now();
      state.failures = 0;
      $("error").hidden = !d.error;
      $("error").textContent = d.error ? "Cannot list the locks: " + d.error : "";
      renderNodes(d.nodes);
      renderLocks(d);
      $("status").textContent = "proxy " + d.proxy + " · updated " + new Date().toLocaleTimeString();
      $("status").className = "status";
    } catch (e) {
      state.failures++;
      if (state.failures > 2) {
        $("status").textContent = "the proxy does not answer (" + e.message + ")";
        $("status").className = "status stale";
      }
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  function refilter() {
    state.match = $("match").value.trim();
    state.count = $("count").value;
    state.cursor = "0";
    state.history = [];
    saveHash();
  }

  $("filter").addEventListener("submit", (e) => { e.preventDefault(); refilter(); });
  $("match").addEventListener("input", refilter);
  $("count").addEventListener("change", refilter);
  $("first").addEventListener("click", () => { state.cursor = "0"; state.history = []; });
  $("next").addEventListener("click", () => {
    if (state.data && state.data.next !== "0") { state.history.push(state.cursor); state.cursor = state.data.next; }
  });
  params();
  setInterval(tick, 100);
  poll();
})();
