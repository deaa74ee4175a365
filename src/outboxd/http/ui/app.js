// The outboxd operator console: hand-written, no library, no build step.
// It talks to the API only (same origin), with the operator's bearer token from
// sessionStorage; no cookie is ever set or sent. Every value from the server is put on the
// page with textContent / text nodes, never as HTML, and every string that comes from
// outside (portal results, error messages, users, domains, URLs, ...) in a <bdi> of its own,
// so the direction controls it may hold cannot reorder the text around it.
// Times are shown in UTC, with the zone written out. Nothing polls: a view holds one request
// at a time (Prefer: wait with If-None-Match) and asks again when it is answered.
"use strict";

(() => {
  const TOKEN_KEY = "outboxd.adminToken";
  // The longest a request is held (the server clamps it to its api.max_wait_s).
  const WAIT_S = 25;
  // The pause after a failed request (doubling up to the max), or after an answer the
  // server did not hold (it holds api.max_waiters already, or waits are off).
  const RETRY_MIN_MS = 1000;
  const RETRY_MAX_MS = 30000;
  const NOT_HELD_MS = 10000;
  const PAGE_SIZE = 25;
  const EVENTS_PER_ANSWER = 1000;
  const TABLE_TITLES = {
    jobs: "Jobs",
    relay_outbox: "Relay outbox",
    work_outbox: "Classification (work outbox)",
    task_runs: "Task runs",
  };
  const JOB_FILTERS = ["status", "user", "errorCode", "from", "to"];

  // ------------------------------------------------------------ DOM helpers

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "testid") node.dataset.testid = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "text") node.textContent = String(v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    append(node, children);
    return node;
  }

  function append(node, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function replace(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // A string from outside, isolated: its bidi controls stay inside it ("—" when absent).
  function ext(value, props) {
    const shown = value === null || value === undefined || value === "" ? "—" : value;
    return el("bdi", { ...props, text: shown });
  }

  // A table with its head, or `empty` as a line when there are no rows.
  function table(props, heads, rows, empty) {
    if (!rows.length) return el("p", { class: "muted", text: empty });
    return el(
      "table",
      props,
      el("thead", {}, el("tr", {}, heads.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows),
    );
  }

  // A definition list from [label, value, testid] triples.
  function kv(pairs, props) {
    return el(
      "dl",
      { class: "kv", ...props },
      pairs.map(([label, value, testid]) => [el("dt", { text: label }), el("dd", { testid }, value)]),
    );
  }

  const main = () => document.getElementById("main");
  const enc = encodeURIComponent;
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const statusSpan = (s, testid) => el("span", { class: "status status-" + s, testid, text: s });

  // "2026-12-03 16:20:01.123 UTC": every time on every page.
  function fmtTime(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return d.toISOString().replace("T", " ").replace("Z", " UTC");
  }

  function fmtDuration(seconds) {
    if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "—";
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 90) return seconds.toFixed(1) + " s";
    if (seconds < 5400) return (seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  const secondsBetween = (a, b) => (Date.parse(b) - Date.parse(a)) / 1000;
  const errorText = (e) => (e ? `${e.code}: ${e.message}` : "");

  function notice(text, bad) {
    const n = document.getElementById("notice");
    n.hidden = !text;
    n.className = bad ? "bad" : "";
    replace(n, text || "");
  }

  // ------------------------------------------------------------ the API

  class AuthProblem extends Error {
    constructor(status, detail) {
      super(detail);
      this.status = status;
    }
  }

  class ApiProblem extends Error {
    constructor(status, body) {
      super((body && (body.detail || body.title)) || "HTTP " + status);
      this.status = status;
      this.code = body && body.code;
    }
  }

  // One request: {status, etag, held, data}; AuthProblem for 401/403, ApiProblem for
  // another error (a 304 is an answer).
  async function call(method, path, opts) {
    const { body, headers: extra, signal } = opts || {};
    const headers = { Accept: "application/json", ...extra };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers, credentials: "omit", cache: "no-store", redirect: "error", signal };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    let data = null;
    if (resp.status !== 304) {
      try {
        data = await resp.json();
      } catch (_e) {
        data = null;
      }
    }
    if (resp.status === 401 || resp.status === 403) {
      throw new AuthProblem(resp.status, data && data.detail);
    }
    if (!resp.ok && resp.status !== 304) throw new ApiProblem(resp.status, data);
    return {
      status: resp.status,
      etag: resp.headers.get("ETag"),
      held: resp.headers.has("Preference-Applied"),
      data,
    };
  }

  const api = async (method, path, body) => (await call(method, path, { body })).data;

  // What only the server knows and pages share (the status names): read once per page.
  let runtimeOnce = null;
  function runtimeInfo() {
    if (!runtimeOnce) {
      runtimeOnce = api("GET", "/v1/admin/runtime").catch((err) => {
        runtimeOnce = null;
        throw err;
      });
    }
    return runtimeOnce;
  }

  // ------------------------------------------------------------ the token

  function showAuth(problem) {
    const box = document.getElementById("auth");
    box.hidden = false;
    box.className = problem.status === 403 ? "forbidden" : "";
    const input = el("input", {
      type: "password",
      name: "token",
      autocomplete: "off",
      placeholder: "admin token",
      testid: "token-input",
    });
    const form = el(
      "form",
      { class: "inline", testid: "token-form" },
      el("label", {}, "Admin token: ", input),
      el("button", { type: "submit", class: "primary" }, "Use token"),
    );
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const value = input.value.trim();
      if (!value) return;
      sessionStorage.setItem(TOKEN_KEY, value);
      location.reload();
    });
    const message =
      problem.status === 403
        ? "Forbidden (403): this token's role may not do that. The console needs a " +
          "viewer token (operator to act, admin for tasks and results)."
        : "This daemon needs an admin token (401): a viewer, operator or admin token. It is kept in this tab's " +
          "sessionStorage only and sent as Authorization: Bearer.";
    replace(box, el("p", { testid: "auth-message", text: message }), form);
    replace(main());
  }

  function setupForget() {
    const btn = document.getElementById("forget-token");
    btn.hidden = !sessionStorage.getItem(TOKEN_KEY);
    btn.addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
  }

  // A failed call: the auth box for 401/403, else a notice. True when a view must stop.
  function handleFailure(err) {
    if (err instanceof AuthProblem) {
      showAuth(err);
      return true;
    }
    notice("Request failed: " + err.message, true);
    return err instanceof ApiProblem && err.status === 404;
  }

  // An operator action: asked first, then run; its notice, or the failure's.
  async function act(question, run) {
    if (!window.confirm(question)) return;
    try {
      const done = await run();
      if (done) notice(done);
    } catch (err) {
      handleFailure(err);
    }
  }

  // ------------------------------------------------------------ waiting, not polling

  // Follows `path`: one request at a time, held by the server (Prefer: wait, If-None-Match
  // naming the last answer) until its answer changes or WAIT_S pass, and asked again as
  // soon as it is answered. `onAnswer(body, changed)` runs after every answer with the
  // newest body (changed: a 200, not a 304). A 401/403/404 stops it; another failure, or
  // an answer the server did not hold, pauses before the next request. Returns stop().
  function follow(path, onAnswer) {
    let stopped = false;
    let ctrl = null;
    let etag = null;
    let last = null;
    let failures = 0;
    let failed = false; // this view's failure is on the notice line
    (async () => {
      while (!stopped) {
        ctrl = new AbortController();
        const headers = etag ? { "If-None-Match": etag, Prefer: "wait=" + WAIT_S } : {};
        let pause = 0;
        try {
          const r = await call("GET", path, { headers, signal: ctrl.signal });
          if (stopped) return;
          const changed = r.status !== 304;
          if (changed) {
            etag = r.etag;
            last = r.data;
          }
          await onAnswer(last, changed);
          if (failed) notice("");
          failed = false;
          failures = 0;
          if (!etag || (headers.Prefer && !r.held)) pause = NOT_HELD_MS;
        } catch (err) {
          if (stopped || (err && err.name === "AbortError")) return;
          if (handleFailure(err)) return;
          failed = true;
          failures += 1;
          pause = Math.min(RETRY_MIN_MS * 2 ** (failures - 1), RETRY_MAX_MS);
        }
        if (pause && !stopped) await sleep(pause);
      }
    })();
    return () => {
      stopped = true;
      if (ctrl) ctrl.abort();
    };
  }

  // A view that can be started again (new filters, an action done): one follow at a time.
  function restartable(start) {
    let stop = () => {};
    return (...args) => {
      stop();
      stop = start(...args);
    };
  }

  // ------------------------------------------------------------ overview

  function overview() {
    const root = main();
    const updated = el("span", { class: "updated", testid: "updated" });
    const tables = el("div", { class: "grid", testid: "tables" });
    const health = el("div", { class: "grid" });
    const chartBox = el("div");
    const schedules = el("div");
    replace(
      root,
      el("h1", {}, "Overview ", updated),
      tables,
      el("h2", {}, "Queues, readiness and pace"),
      health,
      el("h2", {}, "Portal jobs per minute (last hour, this process)"),
      chartBox,
      el("h2", {}, "Scheduler"),
      schedules,
    );
    let statsAt = Date.now();
    // The stats wait for a job's change; this process's state is read with each answer.
    follow("/v1/admin/stats", async (stats, changed) => {
      if (changed) statsAt = Date.now();
      const runtime = await api("GET", "/v1/admin/runtime");
      renderTables(tables, stats, runtime.statuses, (Date.now() - statsAt) / 1000);
      renderHealth(health, stats, runtime);
      renderChart(chartBox, runtime.throughput);
      renderSchedules(schedules, runtime.schedules);
      updated.textContent = "updated " + fmtTime(runtime.now);
    });
  }

  // `since`: seconds since the stats were read (an unchanged answer keeps their ages).
  function renderTables(box, stats, statuses, since) {
    const cards = Object.entries(statuses).map(([name, known]) => {
      const counts = stats.tables[name] || {};
      const names = known.concat(Object.keys(counts).filter((s) => !known.includes(s)));
      const rows = names.map((s) =>
        el(
          "tr",
          {},
          el("td", {}, statusSpan(s)),
          el("td", { class: "num", testid: `count-${name}-${s}`, text: counts[s] || 0 }),
        ),
      );
      const oldest = stats.oldestPendingAgeSeconds[name];
      return el(
        "section",
        { class: "card", testid: "table-" + name },
        el("h3", { text: TABLE_TITLES[name] || name }),
        el("table", {}, el("tbody", {}, rows)),
        el(
          "p",
          { class: "muted" },
          "Oldest pending: ",
          el("span", { testid: "oldest-" + name, text: fmtDuration(oldest === null ? null : oldest + since) }),
        ),
        // A job waiting in SQS is RUNNING, not pending: the backlog a failing portal leaves.
        name === "jobs" ? runningLine(stats.oldestRunningJobAgeSeconds, since) : null,
      );
    });
    replace(box, cards);
  }

  function runningLine(age, since) {
    return el(
      "p",
      { class: "muted" },
      "Oldest running: ",
      el("span", { testid: "oldest-running-jobs", text: fmtDuration(age === null || age === undefined ? null : age + since) }),
    );
  }

  function renderHealth(box, stats, runtime) {
    const checks = Object.entries(runtime.readiness.checks).map(([name, v]) =>
      el("tr", {}, el("td", { text: name }), el("td", {}, statusSpan(v === "ok" ? "ok" : "bad"), " ", v === "ok" ? "" : ext(v))),
    );
    const ready = el(
      "section",
      { class: "card", testid: "readiness" },
      el("h3", {}, "Readiness: ", statusSpan(runtime.readiness.status === "ok" ? "ok" : "bad", "readiness-status")),
      el("table", {}, el("tbody", {}, checks)),
    );
    const q = stats.queues;
    let queueBody;
    if (q === null || q === undefined) queueBody = el("p", { class: "muted", text: "No queue configured." });
    else if (typeof q.error === "string") queueBody = el("p", { class: "error-text" }, ext(q.error));
    else {
      queueBody = table(
        {},
        ["queue", "visible", "in flight", "DLQ"],
        Object.entries(q).map(([name, d]) =>
          el(
            "tr",
            {},
            el("td", { text: name }),
            el("td", { class: "num", testid: `queue-${name}-visible`, text: d.visible }),
            el("td", { class: "num", text: d.inFlight }),
            el("td", { class: "num", testid: `queue-${name}-dlq`, text: d.dlq }),
          ),
        ),
        "No queues.",
      );
    }
    const queues = el("section", { class: "card", testid: "queues" }, el("h3", { text: "SQS depth" }), queueBody);
    const c = runtime.claimer;
    const pace = el(
      "section",
      { class: "card", testid: "claimer" },
      el("h3", { text: "Claimer pace" }),
      c === null
        ? el("p", { class: "muted", text: "No claimer in this process." })
        : kv([
            ["last tick", fmtTime(c.lastTickAt)],
            ["next tick", fmtTime(c.nextTickAt)],
            ["paused until", c.pausedUntil ? fmtTime(c.pausedUntil) : "not paused"],
          ]),
    );
    replace(box, ready, queues, pace);
  }

  function renderChart(box, points) {
    const w = 1000;
    const h = 120;
    // Finished jobs are painted by how they ended: SUCCEEDED green, FAILED or DEAD red.
    points = points.map((p) => ({ ...p, succeeded: p.finished - p.failed }));
    const keys = ["accepted", "succeeded", "failed"];
    const max = Math.max(1, ...points.map((p) => Math.max(...keys.map((k) => p[k]))));
    const chart = svg("svg", { class: "chart", viewBox: `0 0 ${w} ${h + 14}`, role: "img", "data-testid": "chart" });
    chart.appendChild(svg("line", { class: "axis", x1: 0, y1: h, x2: w, y2: h }));
    const slot = w / Math.max(points.length, 1);
    const bw = Math.max(1, slot / keys.length - 1);
    points.forEach((p, i) => {
      keys.forEach((key, j) => {
        const bh = (p[key] / max) * (h - 4);
        const r = svg("rect", { class: key, x: i * slot + j * bw, y: h - bh, width: bw, height: bh });
        r.appendChild(svg("title", {}, `${fmtTime(p.minute)}: ${p[key]} ${key}`));
        chart.appendChild(r);
      });
    });
    chart.append(
      svg("text", { x: 2, y: h + 12 }, "−60 min"),
      svg("text", { x: w - 24, y: h + 12 }, "now"),
      svg("text", { x: 2, y: 10 }, "max " + max + "/min"),
    );
    const total = (k) => points.reduce((a, p) => a + p[k], 0);
    const legend = (key) =>
      el("span", {}, el("span", { class: "sw " + key }), key + ": ", el("b", { testid: key + "-total", text: total(key) }));
    replace(box, chart, el("div", { class: "legend" }, ...keys.map(legend)));
  }

  function renderSchedules(box, items) {
    replace(
      box,
      table(
        { testid: "schedules" },
        ["schedule", "task", "next fire"],
        items.map((s) => el("tr", {}, el("td", {}, ext(s.name)), el("td", {}, ext(s.task)), el("td", { class: "time", text: fmtTime(s.nextFireAt) }))),
        "No schedules in this process.",
      ),
    );
  }

  // ------------------------------------------------------------ jobs

  function jobLink(id) {
    return el("a", { href: "/ui/jobs/" + enc(id), class: "mono", text: id });
  }

  // "2026-12-03 16:20" (UTC) as typed, or a full RFC 3339 time, to what the API reads.
  function toRfc3339(text) {
    const t = text.trim();
    const m = t.match(/^(\d{4}-\d{2}-\d{2})(?:[ T](\d{2}:\d{2})(:\d{2}(?:\.\d+)?)?)?$/);
    if (!m) return t;
    return `${m[1]}T${m[2] || "00:00"}${m[3] || ":00"}Z`;
  }

  // The reverse, for the form: an API time as it would be typed.
  function fromRfc3339(value) {
    const m = (value || "").match(/^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)Z$/);
    return m ? `${m[1]} ${m[2]}` : value || "";
  }

  function jobsList() {
    const root = main();
    const idInput = el("input", { type: "text", class: "wide", placeholder: "job id", testid: "job-lookup" });
    const lookup = el("form", { class: "inline" }, el("label", {}, "Look up a job: ", idInput), el("button", { type: "submit" }, "Open"));
    lookup.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const id = idInput.value.trim();
      if (id) location.assign("/ui/jobs/" + enc(id));
    });
    // The filters live in the URL: a filtered view can be linked, and survives a reload.
    const params = new URLSearchParams(location.search);
    const inputs = {
      status: el("select", { name: "status", testid: "job-status-filter" }, el("option", { value: "", text: "any status" })),
      user: el("input", { type: "text", name: "user", dir: "auto", placeholder: "any user", testid: "job-user-filter" }),
      errorCode: el("input", { type: "text", name: "errorCode", placeholder: "e.g. RETRIES_EXHAUSTED", testid: "job-code-filter" }),
      from: el("input", { type: "text", name: "from", placeholder: "YYYY-MM-DD HH:MM:SS", testid: "job-from-filter" }),
      to: el("input", { type: "text", name: "to", placeholder: "YYYY-MM-DD HH:MM:SS", testid: "job-to-filter" }),
    };
    for (const name of ["user", "errorCode"]) inputs[name].value = params.get(name) || "";
    for (const name of ["from", "to"]) inputs[name].value = fromRfc3339(params.get(name));
    const filters = el(
      "form",
      { class: "inline filters", testid: "job-filters" },
      el("label", {}, "Status: ", inputs.status),
      el("label", {}, "User: ", inputs.user),
      el("label", {}, "Error code: ", inputs.errorCode),
      el("label", {}, "Created from (UTC): ", inputs.from),
      el("label", {}, "to (UTC): ", inputs.to),
      el("button", { type: "submit", class: "primary", testid: "apply-filters" }, "Apply"),
      el("button", { type: "button", testid: "clear-filters", onclick: () => apply(true) }, "Clear"),
    );
    // The search by student number: the API hashes it and finds the jobs by that key (the
    // username is never stored). It stays out of the URL and the history, unlike the filters.
    let username = "";
    const usernameInput = el("input", { type: "search", name: "username", autocomplete: "off", spellcheck: "false", placeholder: "exact student number", testid: "job-username-search" });
    const search = el(
      "form",
      { class: "inline", testid: "job-username-form" },
      el("label", {}, "Find by student number: ", usernameInput),
      el("button", { type: "submit", testid: "job-username-find" }, "Find"),
      el("span", { class: "muted", text: " exact spelling; jobs accepted before the search existed are not found" }),
    );
    search.addEventListener("submit", (ev) => {
      ev.preventDefault();
      username = usernameInput.value;
      cursors.length = 0;
      show(null);
    });
    const listBox = el("div");
    const pager = el("div", { class: "pager" });
    replace(root, el("h1", { text: "Jobs" }), lookup, search, filters, listBox, pager);

    const query = () => {
      const q = new URLSearchParams();
      for (const name of JOB_FILTERS) {
        const raw = inputs[name].value.trim();
        if (raw) q.set(name, name === "from" || name === "to" ? toRfc3339(raw) : raw);
      }
      return q;
    };
    const cursors = [];
    const show = restartable((cursor) => {
      const q = new URLSearchParams(location.search);
      q.set("limit", String(PAGE_SIZE));
      if (cursor) q.set("cursor", cursor);
      if (username) q.set("username", username);
      return follow("/v1/admin/jobs?" + q, (page) => {
        replace(listBox, jobsTable(page.items));
        const buttons = [];
        if (cursors.length) buttons.push(el("button", { type: "button", onclick: () => { cursors.length = 0; show(null); } }, "First page"));
        if (page.nextCursor) buttons.push(el("button", { type: "button", testid: "next-page", onclick: () => { cursors.push(page.nextCursor); show(page.nextCursor); } }, "Next page"));
        replace(pager, buttons);
      });
    });
    function apply(clear) {
      if (clear) {
        for (const input of Object.values(inputs)) input.value = "";
        usernameInput.value = username = "";
      }
      const q = query();
      history.pushState(null, "", "/ui/jobs" + (q.toString() ? "?" + q : ""));
      cursors.length = 0;
      show(null);
    }
    filters.addEventListener("submit", (ev) => {
      ev.preventDefault();
      apply(false);
    });
    inputs.status.addEventListener("change", () => apply(false));
    runtimeInfo()
      .then((rt) => {
        append(inputs.status, rt.statuses.jobs.map((s) => el("option", { value: s, text: s })));
        inputs.status.value = params.get("status") || "";
        show(null);
      })
      .catch(handleFailure);
  }

  function errorCodeLink(code) {
    if (!code) return "";
    return el("a", { href: "/ui/jobs?" + new URLSearchParams({ errorCode: code }), class: "mono" }, ext(code));
  }

  function jobsTable(items) {
    return table(
      { testid: "jobs-table" },
      ["job", "user", "status", "attempts", "created", "finished", "error code", "error"],
      items.map((j) =>
        el(
          "tr",
          { "data-job-id": j.jobId },
          el("td", {}, jobLink(j.jobId)),
          el("td", {}, ext(j.user)),
          el("td", {}, statusSpan(j.status)),
          el("td", { class: "num", text: j.attempts }),
          el("td", { class: "time", text: fmtTime(j.createdAt) }),
          el("td", { class: "time", text: fmtTime(j.finishedAt) }),
          el("td", {}, errorCodeLink(j.error && j.error.code)),
          el("td", { class: "error-text" }, j.error ? ext(j.error.message) : ""),
        ),
      ),
      "No jobs.",
    );
  }

  function resultSummary(result) {
    if (!result) return el("p", { class: "muted", text: "No result." });
    const rows = Object.entries(result).map(([k, v]) => {
      let shown;
      if (Array.isArray(v)) shown = v.length + " item(s)";
      else if (v && typeof v === "object") {
        const fields = Object.entries(v).filter(([, x]) => x === null || typeof x !== "object");
        shown = fields.map(([kk, x], i) => el("span", { class: "field", "data-field": kk }, i ? ", " : "", kk + ": ", ext(x)));
      } else shown = ext(v);
      return [k, shown];
    });
    return kv(rows, { testid: "job-result" });
  }

  function jobPage(jobId) {
    const root = main();
    const summary = el("div");
    const actions = el("div", { class: "pager" });
    const timelineBox = el("div");
    const resultBox = el("div");
    const outboxBox = el("div");
    replace(
      root,
      el("h1", {}, "Job ", el("span", { class: "mono", testid: "job-id", text: jobId })),
      summary,
      actions,
      el("h2", { text: "Timeline" }),
      timelineBox,
      el("h2", { text: "Result" }),
      resultBox,
      el("h2", { text: "Outbox rows" }),
      outboxBox,
    );
    const path = "/v1/jobs/" + enc(jobId);
    const events = [];
    // The job's own route waits for the job; each answer (a change, or the wait's end)
    // brings the admin view and the events since the last one seen.
    follow(path, async () => {
      const job = await api("GET", "/v1/admin/jobs/" + enc(jobId));
      for (;;) {
        const after = events.length ? events[events.length - 1].seq : 0;
        const page = await api("GET", `${path}/events?after=${after}`);
        events.push(...page.events);
        if (page.events.length < EVENTS_PER_ANSWER) break;
      }
      replace(summary, jobSummary(job));
      replace(actions, jobActions(job));
      replace(timelineBox, timeline(events, job));
      replace(resultBox, job.status === "SUCCEEDED" ? resultSummary(job.result) : el("p", { class: "muted", text: "Only a SUCCEEDED job has a result." }));
      replace(outboxBox, outboxTable(job.outbox));
    });
  }

  function jobSummary(job) {
    const progress = job.progress;
    const step = progress ? progress.step + (progress.total ? ` (${progress.done}/${progress.total})` : "") : "—";
    return kv([
      ["status", statusSpan(job.status), "job-status"],
      ["cancel requested", job.cancelRequested ? "yes" : "no", "job-cancel-requested"],
      ["kind", job.kind + " / " + job.portal],
      ["user", ext(job.user), "job-user"],
      ["progress step", ext(step), "job-progress"],
      ["attempts", String(job.attempts), "job-attempts"],
      ["created", fmtTime(job.createdAt), "job-created"],
      ["updated", fmtTime(job.updatedAt), "job-updated"],
      ["finished", fmtTime(job.finishedAt), "job-finished"],
      ["error code", ext(job.error && job.error.code), "job-error-code"],
      ["error message", el("span", { class: "error-text" }, ext(job.error && job.error.message)), "job-error-message"],
    ]);
  }

  // Cancel and redrive; the page shows their effect when its held request is answered.
  function jobActions(job) {
    const id = job.jobId;
    const out = [];
    if (!job.finishedAt && !job.cancelRequested) {
      out.push(
        el("button", {
          type: "button",
          class: "danger",
          testid: "cancel-job",
          "data-needs": "operator",
          onclick: () =>
            act(`Cancel job ${id}? A QUEUED job ends CANCELLED at once; a RUNNING one stops before its next portal request.`, async () => {
              const after = await api("POST", `/v1/jobs/${enc(id)}/cancel`);
              return after.status === "CANCELLED" ? "Job cancelled." : "Cancel requested: its worker stops before its next portal request.";
            }),
        }, "Cancel"),
      );
    }
    if (job.status === "DEAD") {
      out.push(
        el("button", {
          type: "button",
          class: "danger",
          testid: "redrive-job",
          "data-needs": "operator",
          onclick: () =>
            act(`Redrive job ${id}? It goes back to QUEUED with a fresh outbox row.`, async () => {
              await api("POST", `/v1/admin/jobs/${enc(id)}/redrive`);
              return "Job redriven: back to QUEUED.";
            }),
        }, "Redrive"),
      );
    }
    return out;
  }

  // The events as the operator reads them: each attempt (from its `started` to its outcome)
  // one row, with its start, duration, outcome and error; every other event a row.
  function timelineItems(events) {
    const items = [];
    let open = null;
    for (const ev of events) {
      if (ev.type === "started") {
        open = { attempt: ev.attempt, start: ev, end: null, steps: [], lost: false };
        const before = items.findLast((i) => i.start);
        if (before && !before.end) before.lost = true;
        items.push(open);
      } else if (ev.type === "progress" && open) {
        open.steps.push(ev);
      } else if (open && ["retry_scheduled", "released", "succeeded", "failed", "dead", "cancelled"].includes(ev.type)) {
        open.end = ev;
        open = null;
      } else items.push({ event: ev });
    }
    return items;
  }

  function timeline(events, job) {
    const items = timelineItems(events);
    const lastError = items.findLast((i) => i.end && i.end.detail && i.end.detail.code);
    return table(
      { class: "timeline", testid: "timeline" },
      ["when (UTC)", "what", "duration", "outcome", "detail"],
      items.map((i) => (i.event ? eventRow(i.event) : attemptRow(i, job, i === lastError))),
      "No events.",
    );
  }

  const OUTCOMES = {
    retry_scheduled: (d) => `retry in ${fmtDuration(d.delayS)}`,
    released: () => "given back at a shutdown",
    succeeded: () => "succeeded",
    failed: () => "failed",
    dead: () => "dead",
    cancelled: (d) => "cancelled by " + (d.by || "?"),
  };

  function attemptRow(a, job, lastError) {
    const d = (a.end && a.end.detail) || {};
    let outcome = "running";
    if (a.end) outcome = OUTCOMES[a.end.type](d);
    else if (a.lost) outcome = "lost: no outcome recorded (its worker stopped)";
    else if (job.finishedAt) outcome = "—";
    const detail = [];
    if (d.code) {
      detail.push(el("span", { class: "error-text" }, ext(d.code)));
      if (lastError && job.error && job.error.code === d.code) detail.push(": ", el("span", { class: "error-text" }, ext(job.error.message)));
    }
    if (a.steps.length) {
      const steps = a.steps.map((s) => {
        const p = s.detail || {};
        return (p.step || "?") + (p.total ? ` ${p.done}/${p.total}` : "");
      });
      detail.push(el("div", { class: "steps" }, "steps: ", ext(steps.join(" → "))));
    }
    const receive = (a.start.detail || {}).receiveCount;
    detail.push(el("div", { class: "muted" }, "on ", ext(a.start.instance), receive ? `, receive ${receive}` : ""));
    return el(
      "tr",
      { class: "attempt", testid: "timeline-attempt", "data-attempt": a.attempt },
      el("td", { class: "time", text: fmtTime(a.start.at) }),
      el("td", { text: "attempt " + a.attempt }),
      el("td", { class: "num", testid: "attempt-duration", text: a.end ? fmtDuration(secondsBetween(a.start.at, a.end.at)) : "—" }),
      el("td", { testid: "attempt-outcome", class: "outcome-" + (a.end ? a.end.type : "open") }, outcome),
      el("td", { testid: "attempt-detail" }, detail),
    );
  }

  function eventRow(ev) {
    const d = ev.detail || {};
    const who = (by) => ["by ", ext(by)];
    const detail = {
      dispatched: () => ["message ", ext(d.messageId, { class: "mono" }), ", outbox row ", ext(d.outboxId, { class: "mono" })],
      dispatch_failed: () => [el("span", { class: "error-text" }, ext(d.error))],
      redriven: () => [...who(d.by), ", fresh outbox row ", ext(d.outboxId, { class: "mono" })],
      cancel_requested: () => who(d.by),
      cancelled: () => who(d.by),
      dead: () => [el("span", { class: "error-text" }, ext(d.code))],
      failed: () => [el("span", { class: "error-text" }, ext(d.code))],
      progress: () => [ext(d.step)],
    }[ev.type];
    return el(
      "tr",
      { class: "event", testid: "timeline-event", "data-type": ev.type },
      el("td", { class: "time", text: fmtTime(ev.at) }),
      el("td", { text: ev.type.replace(/_/g, " ") }),
      el("td"),
      el("td", {}, statusSpan(ev.status)),
      el("td", {}, detail ? detail() : "", el("div", { class: "muted" }, "on ", ext(ev.instance))),
    );
  }

  // Relay outbox rows; `selected` (a Set of "outbox:<id>") adds checkboxes and buttons.
  function outboxTable(rows, selected) {
    const pick = selected !== undefined;
    const heads = ["row", "for", "status", "attempts", "created", "message id", "last error"];
    return table(
      { testid: "outbox-table" },
      pick ? ["", ...heads, ""] : heads,
      rows.map((r) =>
        el(
          "tr",
          { "data-outbox-id": r.id, class: r.status === "SUPERSEDED" ? "history" : null },
          pick ? el("td", {}, checkbox(selected, "outbox:" + r.id)) : null,
          el("td", { class: "mono", text: r.id }),
          el("td", {}, r.kind === "job" ? jobLink(r.jobId) : el("span", { class: "mono" }, "task ", ext(r.taskId))),
          el("td", {}, statusSpan(r.status), r.status === "SUPERSEDED" ? el("span", { class: "muted", text: " (history: the job was redriven)" }) : ""),
          el("td", { class: "num", text: r.attempts }),
          el("td", { class: "time", text: fmtTime(r.createdAt) }),
          el("td", { class: "mono" }, ext(r.messageId)),
          el("td", { class: "error-text" }, r.lastError ? ext(r.lastError) : ""),
          pick ? el("td", {}, redriveButton([["outbox", r.id]])) : null,
        ),
      ),
      "No rows.",
    );
  }

  // ------------------------------------------------------------ dead letters

  let afterRedrive = () => {};

  function checkbox(selected, key) {
    const box = el("input", { type: "checkbox", "data-key": key });
    box.checked = selected.has(key);
    box.addEventListener("change", () => (box.checked ? selected.add(key) : selected.delete(key)));
    return box;
  }

  // DEAD jobs through the bulk redrive (the one service the API and the CLI use), DEAD
  // relay rows one by one (a task's row has no job to redrive).
  function redrive(targets) {
    const jobIds = targets.filter(([kind]) => kind === "job").map(([, id]) => id);
    const rowIds = targets.filter(([kind]) => kind === "outbox").map(([, id]) => id);
    const what = targets.map(([kind, id]) => `${kind === "job" ? "job" : "outbox row"} ${id}`).join("\n");
    return act(`Redrive ${targets.length} item(s)?\n${what}`, async () => {
      const refused = [];
      let done = 0;
      if (jobIds.length) {
        const r = await api("POST", "/v1/admin/jobs/redrive", { status: "DEAD", jobIds });
        done += r.redriven;
        refused.push(...r.refused.map((x) => `${x.jobId}: ${x.reason}`));
      }
      for (const id of rowIds) {
        try {
          await api("POST", `/v1/admin/outbox/${enc(id)}/redrive`);
          done += 1;
        } catch (err) {
          if (err instanceof AuthProblem) throw err;
          refused.push(`${id}: ${err.message}`);
        }
      }
      afterRedrive();
      if (refused.length) {
        notice(`Redriven ${done}; refused: ${refused.join("; ")}`, true);
        return "";
      }
      return `Redriven ${done} item(s).`;
    });
  }

  function redriveButton(targets) {
    return el("button", { type: "button", class: "danger", testid: "redrive", "data-needs": "operator", onclick: () => redrive(targets) }, "Redrive");
  }

  function deadLetters() {
    const root = main();
    const jobsBox = el("div");
    const rowsBox = el("div");
    const selected = new Set();
    const selectedButton = el("button", {
      type: "button",
      class: "danger",
      testid: "redrive-selected",
          "data-needs": "operator",
      onclick: () => {
        const targets = [...selected].map((k) => k.split(/:(.*)/s).slice(0, 2));
        if (!targets.length) notice("Select rows first.", true);
        else redrive(targets);
      },
    }, "Redrive selected");
    replace(
      root,
      el("h1", { text: "Dead letters" }),
      el("div", { class: "pager" }, selectedButton),
      el("h2", { text: "DEAD jobs" }),
      jobsBox,
      el("h2", { text: "DEAD relay outbox rows" }),
      rowsBox,
    );
    // The DEAD jobs wait for a change; the DEAD rows (a job's, or a task's) are read with
    // each answer. SUPERSEDED rows (a redriven job's history) are not dead letters.
    const show = restartable(() =>
      follow("/v1/admin/jobs?status=DEAD&limit=100", async (jobs) => {
        const rows = await api("GET", "/v1/admin/outbox?status=DEAD&limit=100");
        const present = new Set([...jobs.items.map((j) => "job:" + j.jobId), ...rows.items.map((r) => "outbox:" + r.id)]);
        for (const key of [...selected]) if (!present.has(key)) selected.delete(key);
        replace(jobsBox, deadJobsTable(jobs.items, selected));
        replace(rowsBox, outboxTable(rows.items, selected));
      }),
    );
    afterRedrive = () => show();
    show();
  }

  function deadJobsTable(items, selected) {
    return table(
      { testid: "dead-jobs" },
      ["", "job", "user", "attempts", "finished", "last error", ""],
      items.map((j) =>
        el(
          "tr",
          { "data-job-id": j.jobId },
          el("td", {}, checkbox(selected, "job:" + j.jobId)),
          el("td", {}, jobLink(j.jobId)),
          el("td", {}, ext(j.user)),
          el("td", { class: "num", text: j.attempts }),
          el("td", { class: "time", text: fmtTime(j.finishedAt) }),
          el("td", { class: "error-text" }, j.error ? ext(errorText(j.error)) : ""),
          el("td", {}, redriveButton([["job", j.jobId]])),
        ),
      ),
      "No DEAD jobs.",
    );
  }

  // ------------------------------------------------------------ websites

  function websites() {
    const root = main();
    const counts = el("div");
    const failed = el("div");
    replace(root, el("h1", { text: "Websites" }), el("h2", { text: "Classification states" }), counts, el("h2", { text: "FAILED classifications" }), failed);
    async function load() {
      try {
        const rt = await runtimeInfo();
        const stats = await api("GET", "/v1/admin/stats");
        const page = await api("GET", "/v1/admin/websites?status=FAILED&limit=100");
        const c = stats.tables.work_outbox || {};
        replace(counts, el("table", {}, el("tbody", {}, rt.statuses.work_outbox.map((s) => el("tr", {}, el("td", {}, statusSpan(s)), el("td", { class: "num", testid: "work-" + s, text: c[s] || 0 }))))));
        replace(failed, failedWebsites(page.items, load));
      } catch (err) {
        handleFailure(err);
      }
    }
    load();
  }

  function failedWebsites(items, reload) {
    return table(
      { testid: "failed-websites" },
      ["domain", "favicon URL", "attempts", "last error", ""],
      items.map((w) =>
        el(
          "tr",
          { "data-domain": w.domain },
          el("td", { class: "mono" }, ext(w.domain)),
          el("td", { class: "mono" }, ext(w.faviconUrl)),
          el("td", { class: "num", text: w.classification.attempts }),
          el("td", { class: "error-text" }, ext(w.classification.lastError)),
          el("td", {}, el("button", {
            type: "button",
            testid: "retry-website",
          "data-needs": "operator",
            onclick: () =>
              act(`Send ${w.domain} back to PENDING for classification?`, async () => {
                await api("POST", `/v1/admin/websites/${enc(w.domain)}/retry`);
                reload();
                return `${w.domain} is PENDING again.`;
              }),
          }, "Send back to PENDING")),
        ),
      ),
      "No FAILED classifications.",
    );
  }

  // ------------------------------------------------------------ tasks

  function tasks() {
    const root = main();
    const typeSelect = el("select", { name: "type", testid: "task-type" });
    const payload = el("textarea", { name: "payload", dir: "auto", testid: "task-payload" });
    payload.value = "{}";
    const dedup = el("input", { type: "text", name: "dedupId", dir: "auto", placeholder: "dedup id (optional)" });
    const form = el(
      "form",
      { testid: "task-form", "data-needs": "admin" },
      el("div", { class: "inline" }, el("label", {}, "Type: ", typeSelect), el("label", {}, "Dedup id: ", dedup)),
      el("label", {}, "Payload (a JSON object):", payload),
      el("button", { type: "submit", class: "primary" }, "Enqueue"),
    );
    const list = el("div");
    replace(root, el("h1", { text: "Tasks" }), el("h2", { text: "Enqueue a built-in task" }), form, el("h2", { text: "Recent runs" }), list);
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      let body;
      try {
        body = { type: typeSelect.value, payload: JSON.parse(payload.value || "{}") };
      } catch (_e) {
        notice("The payload is not valid JSON.", true);
        return;
      }
      if (dedup.value.trim()) body.dedupId = dedup.value.trim();
      try {
        const r = await api("POST", "/v1/admin/tasks", body);
        notice("Enqueued task " + r.taskId);
        load();
      } catch (err) {
        handleFailure(err);
      }
    });
    async function load() {
      try {
        const page = await api("GET", "/v1/admin/tasks?limit=50");
        replace(list, tasksTable(page.items));
      } catch (err) {
        handleFailure(err);
      }
    }
    runtimeInfo()
      .then((rt) => {
        replace(typeSelect, rt.taskTypes.map((t) => el("option", { value: t, text: t })));
        load();
      })
      .catch(handleFailure);
  }

  function tasksTable(items) {
    return table(
      { testid: "tasks-table" },
      ["task", "type", "dedup id", "status", "enqueued", "finished", "error"],
      items.map((t) =>
        el(
          "tr",
          {},
          el("td", { class: "mono", text: t.taskId }),
          el("td", {}, ext(t.type)),
          el("td", { class: "mono" }, ext(t.dedupId)),
          el("td", {}, statusSpan(t.status)),
          el("td", { class: "time", text: fmtTime(t.enqueuedAt) }),
          el("td", { class: "time", text: fmtTime(t.finishedAt) }),
          el("td", { class: "error-text" }, t.error ? ext(t.error) : ""),
        ),
      ),
      "No task runs.",
    );
  }

  // ------------------------------------------------------------ dependencies

  // Each outside system's state (up, down, maintenance, paused), the reason and end of a
  // pause, and pause (with a reason) and resume. Read when the page opens, after each
  // action and on Refresh.
  function dependencies() {
    const root = main();
    const list = el("div", { testid: "deps" });
    const refresh = el("button", { type: "button", onclick: () => load() }, "Refresh");
    replace(root, el("h1", { text: "Dependencies" }), el("p", { class: "muted", text:
      "The portal, the AI provider and SQS as every instance sees them. While one is not up " +
      "its work waits, spending no attempt." }), refresh, list);
    async function load() {
      try {
        const body = await api("GET", "/v1/admin/dependencies");
        replace(list, body.items.map(depCard));
      } catch (err) {
        handleFailure(err);
      }
    }
    function depCard(d) {
      const facts = kv([
        ["State", statusSpan(d.state, "dep-state-" + d.name)],
        ["Since", fmtTime(d.since)],
        ["Until", fmtTime(d.until), "dep-until-" + d.name],
        ["Reason", ext(d.reason), "dep-reason-" + d.name],
        ["Paused by", ext(d.pausedBy)],
        ["Outage failures in a row", String(d.failuresInARow)],
        ["Last error", ext(d.lastError)],
        ["Last probe", fmtTime(d.lastProbeAt)],
        ["Waiting", String(d.waiting), "dep-waiting-" + d.name],
      ]);
      let action;
      if (d.state === "paused") {
        action = el("button", {
          type: "button",
          testid: "dep-resume-" + d.name,
          "data-needs": "operator",
          onclick: () =>
            act(`Resume calls to ${d.name}? Its waiting work goes out at the configured pace.`, async () => {
              await api("POST", `/v1/admin/dependencies/${enc(d.name)}/resume`);
              load();
              return `${d.name} resumed.`;
            }),
        }, "Resume");
      } else {
        const reason = el("input", { type: "text", name: "reason", dir: "auto", maxlength: "500",
          required: true, placeholder: "reason (required)", testid: "dep-reason-input-" + d.name });
        const minutes = el("input", { type: "number", name: "minutes", min: "1", step: "1",
          placeholder: "minutes (empty: until resumed)", testid: "dep-minutes-" + d.name });
        action = el("form", { class: "inline", testid: "dep-pause-" + d.name, "data-needs": "operator" },
          el("label", {}, "Reason: ", reason), el("label", {}, "For: ", minutes),
          el("button", { type: "submit" }, "Pause"));
        action.addEventListener("submit", (ev) => {
          ev.preventDefault();
          const why = reason.value.trim();
          if (!why) {
            notice("A pause needs a reason.", true);
            return;
          }
          const body = { reason: why };
          if (minutes.value) body.forS = Number(minutes.value) * 60;
          act(`Pause calls to ${d.name} on every instance?`, async () => {
            await api("POST", `/v1/admin/dependencies/${enc(d.name)}/pause`, body);
            load();
            return `${d.name} paused.`;
          });
        });
      }
      return el("section", { class: "card", testid: "dep-" + d.name }, el("h2", { text: d.name }), facts, action);
    }
    load();
  }

  // ------------------------------------------------------------ the audit log

  // Every attempted change, newest first, filtered by actor and action (kept in the URL).
  function audit() {
    const root = main();
    const params = new URLSearchParams(location.search);
    const actor = el("input", { type: "text", name: "actor", dir: "auto", testid: "audit-actor" });
    const action = el("input", { type: "text", name: "action", dir: "auto", testid: "audit-action" });
    actor.value = params.get("actor") || "";
    action.value = params.get("action") || "";
    const form = el("form", { class: "inline", testid: "audit-filter" },
      el("label", {}, "Actor: ", actor), el("label", {}, "Action: ", action),
      el("button", { type: "submit" }, "Filter"));
    const list = el("div");
    replace(root, el("h1", { text: "Audit log" }), form, list);
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (actor.value.trim()) q.set("actor", actor.value.trim());
      if (action.value.trim()) q.set("action", action.value.trim());
      history.pushState(null, "", "/ui/audit" + (q.toString() ? "?" + q : ""));
      load(q);
    });
    async function load(q) {
      try {
        const page = await api("GET", "/v1/admin/audit?" + new URLSearchParams({ ...Object.fromEntries(q), limit: "100" }));
        replace(list, table({ testid: "audit-table" },
          ["at", "actor", "role", "action", "target", "reason", "outcome", "request id"],
          page.items.map((a) => el("tr", { testid: "audit-row" },
            el("td", { class: "time", text: fmtTime(a.at) }),
            el("td", {}, ext(a.actor)),
            el("td", { text: a.role }),
            el("td", {}, ext(a.action)),
            el("td", { class: "mono" }, ext(a.target)),
            el("td", {}, ext(a.reason)),
            el("td", { class: "num", testid: "audit-outcome", text: a.outcome }),
            el("td", { class: "mono" }, ext(a.requestId)))),
          "No audit rows."));
      } catch (err) {
        handleFailure(err);
      }
    }
    load(params);
  }

  // ------------------------------------------------------------ routing

  const PAGES = {
    "/ui/jobs": ["jobs", jobsList],
    "/ui/dead-letters": ["dead", deadLetters],
    "/ui/websites": ["websites", websites],
    "/ui/tasks": ["tasks", tasks],
    "/ui/dependencies": ["deps", dependencies],
    "/ui/audit": ["audit", audit],
  };

  function route() {
    const path = location.pathname.replace(/\/+$/, "");
    const m = path.match(/^\/ui\/jobs\/(.+)$/);
    let [nav, show] = PAGES[path] || ["overview", overview];
    if (m) [nav, show] = ["jobs", () => jobPage(decodeURIComponent(m[1]))];
    show();
    for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
  }

  setupForget();
  // The caller's role: what it cannot do is not shown (app.css, [data-needs]).
  runtimeInfo()
    .then((rt) => { document.body.dataset.role = rt.role; })
    .catch(() => {});
  // Back and forward between filtered views: the page as its URL says.
  window.addEventListener("popstate", () => location.reload());
  route();
})();
