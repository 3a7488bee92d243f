// breakwater fleet lab page. Talks to `breakwater lab serve`'s JSON API; all model logic is server-side.
// Progress (best stars per mission) is kept in localStorage and follows breakwater.lab.Progress:
// mission 1 is always open, mission k+1 opens once mission k has at least one star, best stars never drop.
"use strict";

(function () {
  const PROGRESS_KEY = "breakwater.lab.progress.v1";
  const SESSION_KEY = "breakwater.lab.session.v1";
  const TOKEN_KEY = "breakwater.lab.token";
  const SLIDER_DEBOUNCE_MS = 40; // short: one run is 20-200 ms and runs are single-flight anyway
  const PALETTE = ["#2557d6", "#d65a25", "#1f8a4c", "#9c3ad6", "#c62f2f", "#0f8fa3", "#a37a0f", "#555f6e"];
  const BOOLS = ["idempotency", "slow_tools", "rolling_deploy", "hot_client"];
  const SLIDERS = ["replicas", "idle_timeout_s", "keepalive_s", "drain_s"];

  const $ = (id) => document.getElementById(id);
  const state = {
    info: null, // GET /api/lab
    mission: null, // selected mission id or null (free play)
    config: null, // the controls, as LabConfig.to_dict() values
    progress: null, // {best: [n x missions]}
    cache: new Map(), // request key -> report, so toggling back is instant
    inflight: false,
    timer: null,
    charts: {},
    lastReport: null,
  };

  // -- token (only when the server was started with one) ------------------------------------------
  (function takeToken() {
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash);
    if (m) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
      history.replaceState(null, "", location.pathname + location.search); // keep it out of the address bar
    }
  })();

  async function api(path, body) {
    const headers = {};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers["Authorization"] = "Bearer " + token;
    const init = { method: body === undefined ? "GET" : "POST", headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    const data = await res.json().catch(() => ({ error: res.statusText }));
    if (!res.ok) {
      const err = new Error(data.error || res.statusText);
      err.key = data.key;
      throw err;
    }
    return data;
  }

  // -- progress: a mirror of breakwater.lab.Progress --------------------------------------------
  function loadProgress(n) {
    try {
      const saved = JSON.parse(localStorage.getItem(PROGRESS_KEY) || "null");
      if (saved && Array.isArray(saved.best) && saved.best.length === n) {
        return { best: saved.best.map((s) => (s === 1 || s === 3 ? s : 0)) };
      }
    } catch (e) { /* a corrupt entry starts over */ }
    return { best: new Array(n).fill(0) };
  }
  const unlocked = (id) => id === 1 || state.progress.best[id - 2] >= 1;
  function record(id, stars) {
    if (!unlocked(id)) return false;
    const before = state.progress.best[id - 1];
    if (stars <= before) return false;
    state.progress.best[id - 1] = stars;
    localStorage.setItem(PROGRESS_KEY, JSON.stringify(state.progress));
    return true;
  }
  const starText = (n) => "★".repeat(n) + "☆".repeat(3 - n);
  const mission = (id) => state.info.missions[id - 1];

  // -- controls ---------------------------------------------------------------------------------
  const form = () => $("controls");
  function readControls() {
    const f = form();
    const c = {
      mode: f.mode.value,
      routing: f.querySelector("input[name=routing]:checked")?.value ?? state.config.routing,
      replicas: Number(f.replicas.value),
      idle_timeout_s: Number(f.idle_timeout_s.value),
      keepalive_s: $("c-keepalive-on").checked ? Number(f.keepalive_s.value) : null,
      drain_s: Number(f.drain_s.value),
      seed: f.seed.value === "" ? state.config.seed : Number(f.seed.value),
    };
    for (const b of BOOLS) c[b] = f[b].checked;
    return c;
  }
  function writeControls(c) {
    const f = form();
    f.mode.value = c.mode;
    for (const r of f.querySelectorAll("input[name=routing]")) r.checked = r.value === c.routing;
    f.replicas.value = c.replicas;
    f.idle_timeout_s.value = c.idle_timeout_s;
    $("c-keepalive-on").checked = c.keepalive_s !== null;
    if (c.keepalive_s !== null) f.keepalive_s.value = c.keepalive_s;
    f.drain_s.value = c.drain_s;
    for (const b of BOOLS) f[b].checked = !!c[b];
    f.seed.value = c.seed;
    showSliderValues();
  }
  function showSliderValues() {
    const f = form();
    $("o-replicas").textContent = f.replicas.value;
    $("o-idle_timeout_s").textContent = f.idle_timeout_s.value + " s";
    const on = $("c-keepalive-on").checked;
    f.keepalive_s.disabled = !on;
    $("o-keepalive_s").textContent = on ? f.keepalive_s.value + " s" : "off";
    $("o-drain_s").textContent = f.drain_s.value + " s";
  }
  function onControlChange(ev) {
    showSliderValues();
    state.config = readControls();
    saveSession();
    // Sliders fire `input` continuously while dragged: debounce those; discrete changes run at once.
    const sliding = ev.type === "input" && ev.target.type === "range";
    scheduleRun(sliding ? SLIDER_DEBOUNCE_MS : 0);
  }
  function saveSession() {
    localStorage.setItem(SESSION_KEY, JSON.stringify({ mission: state.mission, config: state.config }));
  }

  // -- missions ---------------------------------------------------------------------------------
  function renderMissions() {
    const ol = $("missions");
    ol.textContent = "";
    for (const m of state.info.missions) {
      const li = document.createElement("li");
      const b = document.createElement("button");
      b.type = "button";
      b.id = "mission-" + m.id;
      b.dataset.mission = m.id;
      const open = unlocked(m.id);
      b.disabled = !open;
      b.setAttribute("aria-current", String(state.mission === m.id));
      const name = document.createElement("span");
      name.textContent = `M${m.id} · ${m.name}`;
      const stars = document.createElement("span");
      stars.className = "m-stars";
      stars.dataset.best = state.progress.best[m.id - 1];
      stars.textContent = open ? starText(state.progress.best[m.id - 1]) : `locked: earn a star in M${m.id - 1}`;
      b.append(name, stars);
      b.addEventListener("click", () => selectMission(m.id));
      li.append(b);
      ol.append(li);
    }
    $("free-play").setAttribute("aria-current", String(state.mission === null));
  }
  function selectMission(id) {
    if (id !== null && !unlocked(id)) return;
    const changed = state.mission !== id;
    state.mission = id;
    // Choosing a mission starts it from its broken set-up; otherwise the current controls could
    // score it before the player has seen what is wrong.
    if (id !== null && changed) {
      loadSetup();
    } else {
      saveSession();
      scheduleRun(0);
    }
    renderMissions();
    renderMissionCard();
  }
  function loadSetup() {
    if (state.mission === null) return;
    state.config = { ...mission(state.mission).setup };
    writeControls(state.config);
    saveSession();
    scheduleRun(0);
  }
  function renderMissionCard() {
    const card = $("mission-card");
    if (state.mission === null) {
      card.hidden = true;
      return;
    }
    const m = mission(state.mission);
    card.hidden = false;
    $("mission-title").textContent = `M${m.id} · ${m.name}`;
    $("mission-lesson").textContent = m.lesson;
    $("mission-briefing").textContent = "Set-up: " + m.briefing;
    $("mission-goal").textContent = m.goal;
    $("mission-three").textContent = m.three_stars;
  }
  function renderVerdict(report) {
    const v = $("verdict");
    if (report.mission === null) return;
    const m = mission(report.mission);
    const c = report.config;
    const best = state.progress.best[m.id - 1];
    v.dataset.exploration = String(report.exploration);
    let text;
    if (report.exploration) {
      v.dataset.stars = "0";
      $("verdict-stars").textContent = "☆☆☆";
      text = `Exploration: seed ${c.seed} is not the pinned seed ${m.pinned_seed}, so no stars. ` +
        "Set the seed back (or Load mission setup) to score.";
    } else {
      v.dataset.stars = String(report.stars);
      $("verdict-stars").textContent = starText(report.stars);
      if (report.stars === 3) text = "Goal met, efficiently: 3 stars.";
      else if (report.stars === 1) text = "Goal met: 1 star. For 3 stars: " + m.three_stars;
      else {
        const why = [];
        if (c.replicas < state.info.min_replicas_for_stars) {
          why.push(`no stars below ${state.info.min_replicas_for_stars} replicas (a fleet of one is not a fleet)`);
        }
        const off = BOOLS.slice(1).filter((k) => m.setup[k] && !c[k]);
        if (off.length) why.push("keep the mission's injections on: they are the scenario");
        const missed = (report.verdict?.goal ?? []).filter((x) => !x.holds).map((x) => x.text);
        if (!why.length && missed.length) why.push("missed " + missed.join(", "));
        text = "Goal not met" + (why.length ? ": " + why.join("; ") + "." : ".");
      }
    }
    $("verdict-text").textContent = text + ` Best: ${starText(best)}`;
    v.setAttribute("aria-label", `${report.exploration ? 0 : report.stars} stars`);
    renderConditions(report);
    renderTrap(report);
  }
  // Each goal condition, then each 3-star one (once the goal holds), with its value and the miss.
  function renderConditions(report) {
    const ul = $("verdict-conditions");
    ul.textContent = "";
    const verdict = report.verdict;
    if (!verdict) return;
    const goalMet = verdict.goal.every((x) => x.holds);
    const parts = [["goal", verdict.goal]];
    if (goalMet) parts.push(["3 stars", verdict.three_stars]);
    for (const [part, conditions] of parts) {
      for (const x of conditions) {
        const li = document.createElement("li");
        li.className = x.holds ? "held" : "missed";
        li.dataset.key = x.key;
        const tag = document.createElement("span");
        tag.className = "part";
        tag.textContent = part;
        li.append(tag, document.createTextNode(x.text));
        if (!x.holds) {
          const miss = document.createElement("span");
          miss.className = "miss";
          miss.textContent = ": " + x.miss;
          li.append(miss);
        } else if (x.on === "metrics") {
          li.append(document.createTextNode(` (${x.shown})`));
        }
        ul.append(li);
      }
    }
  }

  // -- traps: once the controls match a trap, say why it does not work; remember the ones tried ---
  const TRAPS_KEY = "breakwater.lab.traps.v1";
  function trapsTried() {
    try {
      const saved = JSON.parse(localStorage.getItem(TRAPS_KEY) || "{}");
      return saved && typeof saved === "object" ? saved : {};
    } catch (e) { return {}; }
  }
  // The trap the config is (the set-up with the trap's changes), whatever the seed.
  function trapOf(m, config) {
    const same = (a, b) => Object.keys(a).every((k) => k === "seed" || a[k] === b[k]);
    return m.variants.find((v) => v.kind === "trap" && same({ ...m.setup, ...v.changes }, config)) ?? null;
  }
  function renderTrap(report) {
    const m = mission(report.mission);
    const trap = trapOf(m, report.config);
    const box = $("trap-why");
    const tried = trapsTried();
    if (trap) {
      const keys = tried[m.id] ?? [];
      if (!keys.includes(trap.key)) {
        tried[m.id] = [...keys, trap.key];
        localStorage.setItem(TRAPS_KEY, JSON.stringify(tried));
      }
      $("trap-why-title").textContent = `A trap: ${trap.label}. Expected: ${trap.outcome}.`;
      $("trap-why-text").textContent = "Why: " + trap.why;
      box.dataset.trap = trap.key;
    }
    box.hidden = !trap;
    renderTrapsFound(m, tried);
  }
  function renderTrapsFound(m, tried) {
    const keys = tried[m.id] ?? [];
    const list = $("traps-found-list");
    list.textContent = "";
    for (const v of m.variants) {
      if (v.kind !== "trap" || !keys.includes(v.key)) continue;
      const dt = document.createElement("dt");
      dt.textContent = v.label;
      const dd = document.createElement("dd");
      dd.textContent = v.why;
      list.append(dt, dd);
    }
    $("traps-found").hidden = !list.childElementCount;
  }

  // -- running ----------------------------------------------------------------------------------
  const requestKey = () => JSON.stringify([state.mission, state.config]);
  function scheduleRun(delay) {
    clearTimeout(state.timer);
    state.timer = setTimeout(kick, delay);
  }
  // Single flight, latest wins: the server is CPU-bound, so piling up stale runs would only delay
  // the one the player is looking at.
  async function kick() {
    const key = requestKey();
    const cached = state.cache.get(key);
    if (cached) {
      render(cached);
      return;
    }
    if (state.inflight) return; // the running request re-kicks when it lands
    state.inflight = true;
    document.body.dataset.runState = "running";
    const slow = setTimeout(() => document.querySelector(".results").classList.add("busy"), 150);
    try {
      const report = await api("/api/run", { mission: state.mission, config: state.config });
      state.cache.set(key, report);
      if (state.cache.size > 64) state.cache.delete(state.cache.keys().next().value);
      showError(null);
      if (key === requestKey()) render(report);
    } catch (err) {
      if (key === requestKey()) showError(err);
    } finally {
      clearTimeout(slow);
      document.querySelector(".results").classList.remove("busy");
      state.inflight = false;
      if (key !== requestKey()) kick();
      else document.body.dataset.runState = "idle";
    }
  }
  function showError(err) {
    const el = $("error");
    el.hidden = !err;
    el.textContent = err ? (err.key ? `${err.key}: ` : "") + err.message : "";
  }

  function render(report) {
    state.lastReport = report;
    if (report.mission !== null && !report.exploration && record(report.mission, report.stars)) {
      renderMissions(); // a new best, maybe a newly unlocked mission
    }
    renderVerdict(report);
    renderSummary(report);
    renderMetrics(report.metrics, report.verdict);
    renderCharts(report);
    document.body.dataset.renderedKey = JSON.stringify([report.mission, report.config]);
    document.body.dataset.runState = "idle";
  }

  function renderSummary(r) {
    const c = r.config;
    const inj = [["slow_tools", "slow tools"], ["rolling_deploy", "rolling deploy"], ["hot_client", "hot client"]]
      .filter(([k]) => c[k]).map(([, l]) => l);
    $("summary").textContent = `${c.mode} · ${c.routing.replace("_", "-")} · ${c.replicas} replicas · ` +
      `T ${c.idle_timeout_s} s · K ${c.keepalive_s === null ? "off" : c.keepalive_s + " s"} · W ${c.drain_s} s · ` +
      `idempotency ${c.idempotency ? "on" : "off"} · injections: ${inj.join(", ") || "none"} · seed ${c.seed}`;
    $("timing").textContent = `simulated in ${r.elapsed_ms} ms`;
  }

  // -- metrics ----------------------------------------------------------------------------------
  const secs = (ms) => (ms === null || ms === undefined ? "–" : ms < 10000 ? (ms / 1000).toFixed(2) + " s" :
    ms < 120000 ? (ms / 1000).toFixed(1) + " s" : Math.round(ms / 1000) + " s");
  const num = (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"));
  const pct = (v) => (v * 100).toFixed(0) + " %";
  // [key, label, format, red when > 0]
  const METRICS = [
    ["calls", "calls", num, false], ["ok", "ok", num, false], ["failed", "failed", num, true],
    ["unfinished", "unfinished", num, true], ["p50_ms", "p50 latency", secs, false],
    ["p95_ms", "p95 latency", secs, false], ["p99_ms", "p99 latency", secs, false],
    ["duplicate_side_effects", "duplicate side effects", num, true], ["ghost_writes", "ghost writes", num, true],
    ["dedup_hits", "dedup hits", num, false], ["http_404", "HTTP 404s", num, true],
    ["reinitializations", "re-initializations", num, false], ["sessions_created", "sessions created", num, false],
    ["stream_cuts", "stream cuts", num, false], ["resume_attempts", "resume attempts", num, false],
    ["resumes_ok", "resumes ok", num, false], ["resumes_failed", "resumes failed", num, true],
    ["cancellations", "cancellations", num, false], ["deploy_kills", "deploy kills", num, false],
    ["reissues", "re-issues", num, false], ["lost_results", "lost results", num, false],
    ["wasted_slot_seconds", "wasted slot-seconds", (v) => num(Math.round(v)), false],
    ["utilisation_mean", "utilisation mean", pct, false], ["utilisation_max", "utilisation max", pct, false],
    ["peak_queue", "peak queue (max)", (v) => num(Math.max(...v)), false],
    ["deploy_end_ms", "deploy ends", secs, false],
  ];
  function renderMetrics(m, verdict) {
    const box = $("metrics");
    if (!box.childElementCount) {
      for (const [key, label] of METRICS) {
        const d = document.createElement("div");
        d.className = "metric";
        d.dataset.metric = key;
        d.innerHTML = '<div class="v"></div><div class="k"></div>';
        d.querySelector(".k").textContent = label;
        box.append(d);
      }
    }
    // A tile is red when it counts trouble, or when a goal or 3-star condition on it is missed
    // (p95 latency is no trouble by itself, but it is when the goal caps it).
    const conditions = verdict ? [...verdict.goal, ...verdict.three_stars].filter((x) => x.on === "metrics") : [];
    for (const [key, , fmt, redIfAny] of METRICS) {
      const d = box.querySelector(`[data-metric="${key}"]`);
      d.querySelector(".v").textContent = fmt(m[key]);
      const own = conditions.filter((x) => x.key === key);
      d.classList.toggle("bad", (redIfAny && m[key] > 0) || own.some((x) => !x.holds));
      d.classList.toggle("in-goal", own.length > 0);
      d.title = own.map((x) => (x.holds ? "✓ " : "✗ ") + x.text + (x.holds ? "" : ": " + x.miss)).join("\n");
    }
    const util = m.utilisation.map((u, i) => `r${i} ${pct(u)}`).join(" · ");
    box.querySelector('[data-metric="utilisation_max"]').title = util;
    box.querySelector('[data-metric="peak_queue"]').title = m.peak_queue.map((q, i) => `r${i} ${q}`).join(" · ");
  }

  // -- charts (uPlot) ---------------------------------------------------------------------------
  const clock = (s) => `${Math.floor(s / 60)}:${String(Math.round(s % 60)).padStart(2, "0")}`;
  const zeroBased = (u, min, max) => [0, Math.max(1, max * 1.08)];
  function widthOf(id) {
    return Math.max(200, $(id).clientWidth || $(id).parentElement.clientWidth - 20);
  }
  // Shade the seconds when some replica is draining or down, and mark the end of arrivals (600 s).
  function deployAndWindowHook(report) {
    return (u) => {
      const ctx = u.ctx;
      const { left, top, width, height } = u.bbox;
      ctx.save();
      const states = report.series.state;
      const n = report.series.in_flight.length;
      ctx.fillStyle = "rgba(230, 150, 40, 0.13)";
      let start = -1;
      for (let i = 0; i <= n; i++) {
        const busy = i < n && states.some((s) => s[i] !== 0);
        if (busy && start < 0) start = i;
        if (!busy && start >= 0) {
          const x0 = u.valToPos(start, "x", true);
          const x1 = u.valToPos(i, "x", true);
          ctx.fillRect(Math.max(left, x0), top, Math.min(left + width, x1) - Math.max(left, x0), height);
          start = -1;
        }
      }
      const x = u.valToPos(600, "x", true);
      if (x >= left && x <= left + width) {
        ctx.strokeStyle = "#8a93a3";
        ctx.setLineDash([4, 4]);
        ctx.beginPath();
        ctx.moveTo(x, top);
        ctx.lineTo(x, top + height);
        ctx.stroke();
      }
      ctx.restore();
    };
  }
  function timeChartOpts(id, height, series, report) {
    return {
      width: widthOf(id),
      height,
      cursor: { sync: { key: "lab" }, drag: { x: true, y: false } },
      scales: { x: { time: false }, y: { range: zeroBased } },
      legend: { live: true },
      axes: [
        { values: (u, vals) => vals.map(clock), incrs: [30, 60, 120, 300, 600, 1200], grid: { stroke: "#eef0f3" } },
        { size: 48, grid: { stroke: "#eef0f3" } },
      ],
      series: [{ label: "t", value: (u, v) => (v === null ? "–" : clock(v)) }, ...series],
      hooks: { draw: [(u) => deployAndWindowHook(state.lastReport)(u)] },
    };
  }
  function setChart(id, sig, makeOpts, data) {
    const old = state.charts[id];
    if (old && old.sig === sig) {
      old.plot.setData(data);
      return;
    }
    if (old) old.plot.destroy();
    const el = $(id);
    el.textContent = "";
    state.charts[id] = { sig, plot: new uPlot(makeOpts(), data, el) };
  }
  const line = (label, color, extra) => ({ label, stroke: color, width: 1.5, points: { show: false }, ...extra });
  const filled = (label, color) => line(label, color, { fill: color + "22" });

  function renderCharts(r) {
    if (typeof uPlot === "undefined") return;
    const s = r.series;
    const step = s.bucket_ms / 1000;
    const xs = s.in_flight.map((_, i) => i * step);
    const running = s.in_flight.map((_, i) => s.busy.reduce((a, b) => a + b[i], 0));
    const nrep = s.queue.length;
    setChart("ch-inflight", "1", () => timeChartOpts("ch-inflight", 200,
      [filled("in flight", PALETTE[0]), line("running", PALETTE[2])], r), [xs, s.in_flight, running]);
    setChart("ch-queue", String(nrep), () => timeChartOpts("ch-queue", 200,
      s.queue.map((_, i) => line(`replica ${i}`, PALETTE[i % PALETTE.length])), r), [xs, ...s.queue]);
    const small = [["ch-failures", "failed", s.failures, PALETTE[4]], ["ch-404", "404s", s.http_404, PALETTE[1]],
      ["ch-cuts", "cuts", s.cuts, PALETTE[3]], ["ch-dups", "duplicates", s.duplicates, PALETTE[6]]];
    for (const [id, label, ys, color] of small) {
      setChart(id, "1", () => timeChartOpts(id, 130, [filled(label, color)], r), [xs, ys]);
    }
    const h = r.latency_histogram;
    const labels = h.edges_ms.map((e, i) => i + 1 < h.edges_ms.length ?
      `${e / 1000}–${h.edges_ms[i + 1] / 1000} s` : `≥ ${e / 1000} s`);
    const idx = labels.map((_, i) => i);
    setChart("ch-latency", String(labels.length), () => ({
      width: widthOf("ch-latency"),
      height: 170,
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: false, range: [-0.5, labels.length - 0.5] }, y: { range: zeroBased } },
      axes: [
        { splits: () => idx, values: (u, vals) => vals.map((v) => labels[v] ?? ""), grid: { show: false }, size: 36 },
        { size: 48, grid: { stroke: "#eef0f3" } },
      ],
      series: [{ label: "bucket", value: (u, v) => (v === null ? "–" : labels[v]) },
        { label: "ok calls", stroke: PALETTE[0], fill: PALETTE[0] + "88", width: 1,
          paths: uPlot.paths.bars({ size: [0.7, 90] }), points: { show: false } }],
    }), [idx, h.counts]);
  }
  function resizeCharts() {
    for (const [id, c] of Object.entries(state.charts)) c.plot.setSize({ width: widthOf(id), height: c.plot.height });
  }

  // -- start ------------------------------------------------------------------------------------
  function renderParameters() {
    const t = $("parameters");
    for (const [k, v] of state.info.parameters) {
      const tr = t.insertRow();
      tr.insertCell().textContent = k;
      tr.insertCell().textContent = v;
    }
  }
  function applyRanges() {
    const f = form();
    for (const key of SLIDERS) {
      const [min, max, step] = state.info.ranges[key];
      Object.assign(f[key], { min, max, step });
    }
  }
  function restoreSession() {
    try {
      const s = JSON.parse(localStorage.getItem(SESSION_KEY) || "null");
      if (s && s.config && typeof s.config === "object") {
        const mission = Number.isInteger(s.mission) && s.mission >= 1 && s.mission <= state.info.missions.length &&
          unlocked(s.mission) ? s.mission : null;
        return { mission, config: { ...state.info.defaults, ...s.config } };
      }
    } catch (e) { /* start fresh */ }
    return { mission: null, config: { ...state.info.defaults } };
  }

  async function start() {
    state.info = await api("/api/lab");
    state.progress = loadProgress(state.info.missions.length);
    applyRanges();
    renderParameters();
    const s = restoreSession();
    state.mission = s.mission;
    state.config = s.config;
    writeControls(state.config);
    renderMissions();
    renderMissionCard();
    const f = form();
    f.addEventListener("input", onControlChange);
    f.addEventListener("change", onControlChange);
    f.addEventListener("submit", (e) => e.preventDefault());
    $("load-setup").addEventListener("click", loadSetup);
    $("free-play").addEventListener("click", () => selectMission(null));
    $("new-seed").addEventListener("click", async () => {
      try {
        const { config } = await api("/api/new-seed", { config: state.config });
        state.config = config;
        writeControls(config);
        saveSession();
        scheduleRun(0);
      } catch (err) { showError(err); }
    });
    $("explain-link").addEventListener("click", () => { $("assumptions").open = true; });
    let resizeTimer = null;
    window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(resizeCharts, 100); });
    scheduleRun(0);
  }

  window.addEventListener("DOMContentLoaded", () => {
    start().catch((err) => showError(err));
  });
})();
