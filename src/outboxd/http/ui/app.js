// The outboxd operator console: hand-written, no library, no build step.
// It talks to the admin API only (same origin), with the operator's bearer token
// from sessionStorage; no cookie is ever set or sent. Every value from the server
// is put on the page with textContent / text nodes, never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "outboxd.adminToken";
  const REFRESH_MS = 1000; // at most one refresh a second, and never two at once
  const JOB_STATUSES = ["QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "DEAD"];
  const TERMINAL = new Set(["SUCCEEDED", "FAILED", "DEAD"]);
  const TABLE_STATUSES = {
    jobs: JOB_STATUSES,
    relay_outbox: ["PENDING", "RETRYABLE_FAILED", "SENT", "DEAD"],
    work_outbox: ["PENDING", "PROCESSING", "COMPLETED", "FAILED"],
    task_runs: ["PENDING", "SENT", "SUCCEEDED", "FAILED", "DEAD"],
  };
  const TABLE_TITLES = {
    jobs: "Jobs",
    relay_outbox: "Relay outbox",
    work_outbox: "Classification (work outbox)",
    task_runs: "Task runs",
  };

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
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  function replace(node, ...children) {
    node.replaceChildren();
    return append(node, children);
  }

  function svg(tag, attrs) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    return node;
  }

  const main = () => document.getElementById("main");
  const fmtTime = (iso) => (iso ? new Date(iso).toLocaleString() : "—");
  const statusSpan = (s, testid) => el("span", { class: "status status-" + s, testid, text: s });

  function age(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    if (seconds < 90) return seconds.toFixed(1) + " s";
    if (seconds < 5400) return (seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  function notice(text, bad) {
    const n = document.getElementById("notice");
    n.hidden = !text;
    n.className = bad ? "bad" : "";
    replace(n, text || "");
  }

  // ------------------------------------------------------------ the admin API

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

  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers, credentials: "omit", cache: "no-store", redirect: "error" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(path, init);
    let data = null;
    try {
      data = await resp.json();
    } catch (_e) {
      data = null;
    }
    if (resp.status === 401 || resp.status === 403) {
      throw new AuthProblem(resp.status, data && data.detail);
    }
    if (!resp.ok) throw new ApiProblem(resp.status, data);
    return data;
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
        ? "Forbidden (403): this token does not have the admin role. " +
          "The console needs an admin token."
        : "This daemon needs an admin token (401). It is kept in this tab's " +
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

  // A failed call: the auth box for 401/403, else a notice. True when polling must stop.
  function handleFailure(err) {
    if (err instanceof AuthProblem) {
      showAuth(err);
      return true;
    }
    notice("Request failed: " + err.message, true);
    return false;
  }

  // ------------------------------------------------------------ polling

  // Runs `step` now and then REFRESH_MS after each run *finishes*: one request chain,
  // never overlapping, whatever the clock does. `step` returns false to stop.
  function poll(step) {
    let stopped = false;
    const run = async () => {
      if (stopped) return;
      let again = true;
      try {
        again = (await step()) !== false;
      } catch (err) {
        again = !handleFailure(err);
      }
      if (again && !stopped) setTimeout(run, REFRESH_MS);
    };
    run();
    return () => {
      stopped = true;
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
    poll(async () => {
      // One after the other: the refresh is one request chain.
      const stats = await api("GET", "/v1/admin/stats");
      const runtime = await api("GET", "/v1/admin/runtime");
      renderTables(tables, stats);
      renderHealth(health, stats, runtime);
      renderChart(chartBox, runtime.throughput);
      renderSchedules(schedules, runtime.schedules);
      notice("");
      updated.textContent = "updated " + new Date().toLocaleTimeString();
      return true;
    });
  }

  function renderTables(box, stats) {
    const cards = [];
    for (const [table, known] of Object.entries(TABLE_STATUSES)) {
      const counts = stats.tables[table] || {};
      const statuses = known.concat(Object.keys(counts).filter((s) => !known.includes(s)));
      const rows = statuses.map((s) =>
        el(
          "tr",
          {},
          el("td", {}, statusSpan(s)),
          el("td", { class: "num", testid: `count-${table}-${s}`, text: counts[s] || 0 }),
        ),
      );
      const oldest = stats.oldestPendingAgeSeconds[table];
      cards.push(
        el(
          "section",
          { class: "card", testid: "table-" + table },
          el("h3", { text: TABLE_TITLES[table] || table }),
          el("table", {}, el("tbody", {}, rows)),
          el("p", { class: "muted" }, "Oldest pending: ", el("span", {
            testid: "oldest-" + table,
            text: age(oldest),
          })),
        ),
      );
    }
    replace(box, cards);
  }

  function renderHealth(box, stats, runtime) {
    const checks = Object.entries(runtime.readiness.checks).map(([name, v]) =>
      el("tr", {}, el("td", { text: name }), el("td", {}, statusSpan(v === "ok" ? "ok" : "bad"), " ", v === "ok" ? "" : v)),
    );
    const ready = el(
      "section",
      { class: "card", testid: "readiness" },
      el("h3", {}, "Readiness: ", statusSpan(runtime.readiness.status === "ok" ? "ok" : "bad", "readiness-status")),
      el("table", {}, el("tbody", {}, checks)),
    );
    let queueBody;
    const q = stats.queues;
    if (q === null || q === undefined) queueBody = el("p", { class: "muted", text: "No queue configured." });
    else if (typeof q.error === "string") queueBody = el("p", { class: "error-text", text: q.error });
    else {
      queueBody = el(
        "table",
        {},
        el("thead", {}, el("tr", {}, el("th", { text: "queue" }), el("th", { text: "visible" }), el("th", { text: "in flight" }), el("th", { text: "DLQ" }))),
        el(
          "tbody",
          {},
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
        ),
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
        : el(
            "dl",
            { class: "kv" },
            el("dt", { text: "last tick" }), el("dd", { text: fmtTime(c.lastTickAt) }),
            el("dt", { text: "next tick" }), el("dd", { text: fmtTime(c.nextTickAt) }),
            el("dt", { text: "paused until" }), el("dd", { text: c.pausedUntil ? fmtTime(c.pausedUntil) : "not paused" }),
          ),
    );
    replace(box, ready, queues, pace);
  }

  function renderChart(box, points) {
    const w = 1000;
    const h = 120;
    const max = Math.max(1, ...points.map((p) => Math.max(p.accepted, p.finished)));
    const chart = svg("svg", { class: "chart", viewBox: `0 0 ${w} ${h + 14}`, role: "img", "data-testid": "chart" });
    chart.appendChild(svg("line", { class: "axis", x1: 0, y1: h, x2: w, y2: h }));
    const slot = w / Math.max(points.length, 1);
    points.forEach((p, i) => {
      const bw = Math.max(1, slot / 2 - 1);
      for (const [j, key] of [[0, "accepted"], [1, "finished"]]) {
        const bh = (p[key] / max) * (h - 4);
        const r = svg("rect", { class: key, x: i * slot + j * bw, y: h - bh, width: bw, height: bh });
        const title = svg("title");
        title.textContent = `${fmtTime(p.minute)}: ${p[key]} ${key}`;
        r.appendChild(title);
        chart.appendChild(r);
      }
    });
    const label = svg("text", { x: 2, y: h + 12 });
    label.textContent = "−60 min";
    const label2 = svg("text", { x: w - 24, y: h + 12 });
    label2.textContent = "now";
    const top = svg("text", { x: 2, y: 10 });
    top.textContent = "max " + max + "/min";
    chart.append(label, label2, top);
    const total = (k) => points.reduce((a, p) => a + p[k], 0);
    replace(
      box,
      chart,
      el(
        "div",
        { class: "legend" },
        el("span", {}, el("span", { class: "sw accepted" }), "accepted: ", el("b", { testid: "accepted-total", text: total("accepted") })),
        el("span", {}, el("span", { class: "sw finished" }), "finished: ", el("b", { testid: "finished-total", text: total("finished") })),
      ),
    );
  }

  function renderSchedules(box, items) {
    if (!items.length) {
      replace(box, el("p", { class: "muted", text: "No schedules in this process." }));
      return;
    }
    replace(
      box,
      el(
        "table",
        { testid: "schedules" },
        el("thead", {}, el("tr", {}, el("th", { text: "schedule" }), el("th", { text: "task" }), el("th", { text: "next fire" }))),
        el("tbody", {}, items.map((s) => el("tr", {}, el("td", { text: s.name }), el("td", { text: s.task }), el("td", { text: fmtTime(s.nextFireAt) })))),
      ),
    );
  }

  // ------------------------------------------------------------ jobs

  function jobLink(id) {
    return el("a", { href: "/ui/jobs/" + encodeURIComponent(id), class: "mono", text: id });
  }

  function jobsList() {
    const root = main();
    const idInput = el("input", { type: "text", class: "wide", placeholder: "job id", testid: "job-lookup" });
    const lookup = el("form", { class: "inline" }, el("label", {}, "Look up a job: ", idInput), el("button", { type: "submit" }, "Open"));
    lookup.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const id = idInput.value.trim();
      if (id) location.assign("/ui/jobs/" + encodeURIComponent(id));
    });
    const params = new URLSearchParams(location.search);
    const select = el("select", { testid: "job-status-filter" }, el("option", { value: "", text: "any status" }), JOB_STATUSES.map((s) => el("option", { value: s, text: s })));
    select.value = params.get("status") || "";
    select.addEventListener("change", () => {
      cursors.length = 0;
      load(null);
    });
    const listBox = el("div");
    const pager = el("div", { class: "pager" });
    replace(root, el("h1", { text: "Jobs" }), lookup, el("form", { class: "inline" }, el("label", {}, "Status: ", select)), listBox, pager);
    const cursors = [];
    async function load(cursor) {
      const q = new URLSearchParams({ limit: "25" });
      if (select.value) q.set("status", select.value);
      if (cursor) q.set("cursor", cursor);
      let page;
      try {
        page = await api("GET", "/v1/admin/jobs?" + q);
      } catch (err) {
        handleFailure(err);
        return;
      }
      replace(listBox, jobsTable(page.items));
      const buttons = [];
      if (cursors.length) buttons.push(el("button", { type: "button", onclick: () => { cursors.length = 0; load(null); } }, "First page"));
      if (page.nextCursor) buttons.push(el("button", { type: "button", testid: "next-page", onclick: () => { cursors.push(page.nextCursor); load(page.nextCursor); } }, "Next page"));
      replace(pager, buttons);
    }
    load(null);
  }

  function jobsTable(items) {
    if (!items.length) return el("p", { class: "muted", text: "No jobs." });
    return el(
      "table",
      { testid: "jobs-table" },
      el("thead", {}, el("tr", {}, ["job", "status", "attempts", "created", "error"].map((h) => el("th", { text: h })))),
      el(
        "tbody",
        {},
        items.map((j) =>
          el(
            "tr",
            {},
            el("td", {}, jobLink(j.jobId)),
            el("td", {}, statusSpan(j.status)),
            el("td", { class: "num", text: j.attempts }),
            el("td", { text: fmtTime(j.createdAt) }),
            el("td", { class: "error-text", text: j.error ? `${j.error.code}: ${j.error.message}` : "" }),
          ),
        ),
      ),
    );
  }

  function resultSummary(result) {
    if (!result) return el("p", { class: "muted", text: "No result." });
    const rows = [];
    for (const [k, v] of Object.entries(result)) {
      let shown;
      if (Array.isArray(v)) shown = v.length + " item(s)";
      else if (v && typeof v === "object") {
        shown = Object.entries(v)
          .filter(([, x]) => x === null || typeof x !== "object")
          .map(([kk, x]) => `${kk}: ${x === null ? "—" : x}`)
          .join(", ");
      } else shown = v === null ? "—" : String(v);
      rows.push(el("dt", { text: k }), el("dd", { text: shown }));
    }
    return el("dl", { class: "kv", testid: "job-result" }, rows);
  }

  function jobPage(jobId) {
    const root = main();
    const body = el("div");
    replace(root, el("h1", {}, "Job ", el("span", { class: "mono", testid: "job-id", text: jobId })), body);
    let stop = null;
    const start = () => {
      if (stop) stop();
      stop = poll(async () => {
        const job = await api("GET", "/v1/admin/jobs/" + encodeURIComponent(jobId));
        renderJob(body, job, start);
        notice("");
        return !TERMINAL.has(job.status) || job.outbox.some((o) => o.status === "PENDING" || o.status === "RETRYABLE_FAILED");
      });
    };
    start();
  }

  function renderJob(box, job, restart) {
    const progress = job.progress || {};
    const step = progress.step || progress.stage || (Object.keys(progress).length ? JSON.stringify(progress) : "—");
    const kv = el(
      "dl",
      { class: "kv" },
      el("dt", { text: "status" }), el("dd", {}, statusSpan(job.status, "job-status")),
      el("dt", { text: "kind" }), el("dd", { text: job.kind + " / " + job.portal }),
      el("dt", { text: "progress step" }), el("dd", { testid: "job-progress", text: step }),
      el("dt", { text: "attempts" }), el("dd", { testid: "job-attempts", text: job.attempts }),
      el("dt", { text: "created" }), el("dd", { text: fmtTime(job.createdAt) }),
      el("dt", { text: "updated" }), el("dd", { text: fmtTime(job.updatedAt) }),
      el("dt", { text: "finished" }), el("dd", { text: fmtTime(job.finishedAt) }),
      el("dt", { text: "error code" }), el("dd", { testid: "job-error-code", text: job.error ? job.error.code : "—" }),
      el("dt", { text: "error message" }), el("dd", { class: "error-text", testid: "job-error-message", text: job.error ? job.error.message : "—" }),
    );
    const actions = [];
    if (job.status === "DEAD") {
      actions.push(
        el("button", {
          type: "button",
          class: "danger",
          testid: "redrive-job",
          onclick: async () => {
            if (!window.confirm(`Redrive job ${job.jobId}? It goes back to QUEUED with a fresh outbox row.`)) return;
            try {
              await api("POST", `/v1/admin/jobs/${encodeURIComponent(job.jobId)}/redrive`);
              notice("Job redriven: back to QUEUED.");
              restart();
            } catch (err) {
              handleFailure(err);
            }
          },
        }, "Redrive"),
      );
    }
    replace(
      box,
      kv,
      el("div", { class: "pager" }, actions),
      el("h2", { text: "Result" }),
      job.status === "SUCCEEDED" ? resultSummary(job.result) : el("p", { class: "muted", text: "Only a SUCCEEDED job has a result." }),
      el("h2", { text: "Outbox rows" }),
      outboxTable(job.outbox, false),
    );
  }

  function outboxTable(rows, selectable, selected) {
    if (!rows.length) return el("p", { class: "muted", text: "No rows." });
    return el(
      "table",
      { testid: "outbox-table" },
      el("thead", {}, el("tr", {}, selectable ? el("th") : null, ["row", "for", "status", "attempts", "created", "last error"].map((h) => el("th", { text: h })), selectable ? el("th") : null)),
      el(
        "tbody",
        {},
        rows.map((r) =>
          el(
            "tr",
            { "data-outbox-id": r.id },
            selectable ? el("td", {}, checkbox(selected, "outbox:" + r.id)) : null,
            el("td", { class: "mono", text: r.id }),
            el("td", {}, r.kind === "job" ? jobLink(r.jobId) : el("span", { class: "mono", text: "task " + r.taskId })),
            el("td", {}, statusSpan(r.status)),
            el("td", { class: "num", text: r.attempts }),
            el("td", { text: fmtTime(r.createdAt) }),
            el("td", { class: "error-text", text: r.lastError || "" }),
            selectable ? el("td", {}, redriveButton(() => [["outbox", r.id]])) : null,
          ),
        ),
      ),
    );
  }

  // ------------------------------------------------------------ dead letters

  let redriveDone = () => {};

  function checkbox(selected, key) {
    const box = el("input", { type: "checkbox", "data-key": key });
    box.addEventListener("change", () => (box.checked ? selected.add(key) : selected.delete(key)));
    return box;
  }

  async function redrive(targets) {
    const what = targets.map(([kind, id]) => `${kind === "job" ? "job" : "outbox row"} ${id}`).join("\n");
    if (!window.confirm(`Redrive ${targets.length} item(s)?\n${what}`)) return;
    const failed = [];
    for (const [kind, id] of targets) {
      const path = kind === "job" ? `/v1/admin/jobs/${encodeURIComponent(id)}/redrive` : `/v1/admin/outbox/${encodeURIComponent(id)}/redrive`;
      try {
        await api("POST", path);
      } catch (err) {
        if (err instanceof AuthProblem) {
          handleFailure(err);
          return;
        }
        failed.push(`${id}: ${err.message}`);
      }
    }
    notice(
      failed.length ? `Redriven ${targets.length - failed.length}; failed: ${failed.join("; ")}` : `Redriven ${targets.length} item(s).`,
      failed.length > 0,
    );
    redriveDone();
  }

  function redriveButton(targets) {
    return el("button", { type: "button", class: "danger", testid: "redrive", onclick: () => redrive(targets()) }, "Redrive");
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
      onclick: () => {
        const targets = [...selected].map((k) => k.split(/:(.*)/s).slice(0, 2));
        if (!targets.length) notice("Select rows first.", true);
        else redrive(targets);
      },
    }, "Redrive selected");
    replace(root, el("h1", { text: "Dead letters" }), el("div", { class: "pager" }, selectedButton), el("h2", { text: "DEAD jobs" }), jobsBox, el("h2", { text: "DEAD relay outbox rows" }), rowsBox);
    async function load() {
      selected.clear();
      try {
        const jobs = await api("GET", "/v1/admin/jobs?status=DEAD&limit=100");
        const rows = await api("GET", "/v1/admin/outbox?status=DEAD&limit=100");
        replace(jobsBox, deadJobsTable(jobs.items, selected));
        replace(rowsBox, outboxTable(rows.items, true, selected));
      } catch (err) {
        handleFailure(err);
      }
    }
    redriveDone = load;
    load();
  }

  function deadJobsTable(items, selected) {
    if (!items.length) return el("p", { class: "muted", text: "No DEAD jobs." });
    return el(
      "table",
      { testid: "dead-jobs" },
      el("thead", {}, el("tr", {}, el("th"), ["job", "attempts", "finished", "last error"].map((h) => el("th", { text: h })), el("th"))),
      el(
        "tbody",
        {},
        items.map((j) =>
          el(
            "tr",
            { "data-job-id": j.jobId },
            el("td", {}, checkbox(selected, "job:" + j.jobId)),
            el("td", {}, jobLink(j.jobId)),
            el("td", { class: "num", text: j.attempts }),
            el("td", { text: fmtTime(j.finishedAt) }),
            el("td", { class: "error-text", text: j.error ? `${j.error.code}: ${j.error.message}` : "" }),
            el("td", {}, redriveButton(() => [["job", j.jobId]])),
          ),
        ),
      ),
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
        const stats = await api("GET", "/v1/admin/stats");
        const page = await api("GET", "/v1/admin/websites?status=FAILED&limit=100");
        const c = stats.tables.work_outbox || {};
        replace(counts, el("table", {}, el("tbody", {}, TABLE_STATUSES.work_outbox.map((s) => el("tr", {}, el("td", {}, statusSpan(s)), el("td", { class: "num", testid: "work-" + s, text: c[s] || 0 }))))));
        replace(failed, failedWebsites(page.items, load));
      } catch (err) {
        handleFailure(err);
      }
    }
    load();
  }

  function failedWebsites(items, reload) {
    if (!items.length) return el("p", { class: "muted", text: "No FAILED classifications." });
    return el(
      "table",
      { testid: "failed-websites" },
      el("thead", {}, el("tr", {}, ["domain", "attempts", "last error", ""].map((h) => el("th", { text: h })))),
      el(
        "tbody",
        {},
        items.map((w) =>
          el(
            "tr",
            { "data-domain": w.domain },
            el("td", { class: "mono", text: w.domain }),
            el("td", { class: "num", text: w.classification.attempts }),
            el("td", { class: "error-text", text: w.classification.lastError || "" }),
            el("td", {}, el("button", {
              type: "button",
              testid: "retry-website",
              onclick: async () => {
                if (!window.confirm(`Send ${w.domain} back to PENDING for classification?`)) return;
                try {
                  await api("POST", `/v1/admin/websites/${encodeURIComponent(w.domain)}/retry`);
                  notice(`${w.domain} is PENDING again.`);
                  reload();
                } catch (err) {
                  handleFailure(err);
                }
              },
            }, "Send back to PENDING")),
          ),
        ),
      ),
    );
  }

  // ------------------------------------------------------------ tasks

  function tasks() {
    const root = main();
    const typeSelect = el("select", { name: "type", testid: "task-type" });
    const payload = el("textarea", { name: "payload", testid: "task-payload" });
    payload.value = "{}";
    const dedup = el("input", { type: "text", name: "dedupId", placeholder: "dedup id (optional)" });
    const form = el(
      "form",
      { testid: "task-form" },
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
    api("GET", "/v1/admin/runtime")
      .then((rt) => {
        replace(typeSelect, rt.taskTypes.map((t) => el("option", { value: t, text: t })));
        load();
      })
      .catch(handleFailure);
  }

  function tasksTable(items) {
    if (!items.length) return el("p", { class: "muted", text: "No task runs." });
    return el(
      "table",
      { testid: "tasks-table" },
      el("thead", {}, el("tr", {}, ["task", "type", "status", "enqueued", "finished", "error"].map((h) => el("th", { text: h })))),
      el("tbody", {}, items.map((t) => el("tr", {}, el("td", { class: "mono", text: t.taskId }), el("td", { text: t.type }), el("td", {}, statusSpan(t.status)), el("td", { text: fmtTime(t.enqueuedAt) }), el("td", { text: fmtTime(t.finishedAt) }), el("td", { class: "error-text", text: t.error || "" })))),
    );
  }

  // ------------------------------------------------------------ routing

  function route() {
    const path = location.pathname.replace(/\/+$/, "");
    let nav = "overview";
    const m = path.match(/^\/ui\/jobs\/(.+)$/);
    if (m) {
      nav = "jobs";
      jobPage(decodeURIComponent(m[1]));
    } else if (path === "/ui/jobs") {
      nav = "jobs";
      jobsList();
    } else if (path === "/ui/dead-letters") {
      nav = "dead";
      deadLetters();
    } else if (path === "/ui/websites") {
      nav = "websites";
      websites();
    } else if (path === "/ui/tasks") {
      nav = "tasks";
      tasks();
    } else overview();
    for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
  }

  setupForget();
  route();
})();
