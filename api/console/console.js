/*
 * Sluice web console: the pages under /console (Endpoints, Latency, Dead letters, Event
 * search) read everything from sluice-api's JSON routes with the API key the user typed.
 *
 * The key lives in this tab's sessionStorage only (gone when the tab closes), is sent as
 * "Authorization: Bearer" and never put in a URL, the page or a log. Pages hold no data of
 * their own: each load asks the API. Errors (problem+json) are shown in the status live
 * region with their HTTP status, e.g. a read-only key's 403 on replay.
 * Everything from the API is inserted as text (textContent), never as HTML.
 */
(function () {
  "use strict";

  var KEY_STORE = "sluice.console.apiKey";
  var $ = function (id) { return document.getElementById(id); };

  /* ==== the key ==== */

  function getKey() {
    try { return window.sessionStorage.getItem(KEY_STORE) || ""; } catch (e) { return ""; }
  }

  /* "slk_<id>_<secret>" -> "slk_<id>" (the id is safe to show; the secret never is) */
  function keyId(k) {
    var m = /^slk_([a-z0-9]{16})_/.exec(k);
    return m ? "slk_" + m[1] : "(not a Sluice key)";
  }

  function showKeyState() {
    var k = getKey();
    $("key-form").hidden = !!k;
    $("key-set").hidden = !k;
    $("key-id").textContent = k ? keyId(k) : "";
  }

  function setupKey(onKey) {
    $("key-form").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var input = $("key-input");
      var v = input.value.trim();
      input.value = "";
      if (!v) { return; }
      window.sessionStorage.setItem(KEY_STORE, v);
      showKeyState();
      $("key-forget").focus();
      onKey();
    });
    $("key-forget").addEventListener("click", function () {
      window.sessionStorage.removeItem(KEY_STORE);
      showKeyState();
      status("The key was forgotten.", "ok");
      $("key-input").focus();
    });
    showKeyState();
  }

  /* ==== status (live region) ==== */

  function status(text, kind) {
    var s = $("status");
    s.className = "status" + (kind ? " " + kind : "");
    s.textContent = text;
  }

  /* ==== API calls ==== */

  function ApiError(st, problem) {
    this.status = st;
    this.problem = problem || {};
    var title = this.problem.title || "Error";
    var detail = this.problem.detail ? ": " + this.problem.detail : "";
    this.message = "HTTP " + st + " " + title + detail;
  }

  /* GET or POST path (a /v1 route) with the key; resolves to the parsed JSON. timeoutMs
   * (optional): give up on an answer after it, as on no answer at all. */
  function api(path, body, timeoutMs) {
    var k = getKey();
    if (!k) {
      return Promise.reject(new ApiError(401, { title: "No API key",
        detail: "enter an API key above first" }));
    }
    var opts = { method: body ? "POST" : "GET", cache: "no-store", credentials: "omit",
                 referrerPolicy: "no-referrer",
                 headers: { "Authorization": "Bearer " + k, "Accept": "application/json" } };
    if (body) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    if (timeoutMs && typeof AbortController === "function") {
      var ctl = new AbortController();
      opts.signal = ctl.signal;
      setTimeout(function () { ctl.abort(); }, timeoutMs);
    }
    return fetch(path, opts).then(function (resp) {
      return resp.text().then(function (text) {
        var j = null;
        try { j = text ? JSON.parse(text) : null; } catch (e) { j = null; }
        if (!resp.ok) { throw new ApiError(resp.status, j); }
        return j;
      });
    }, function () {
      throw new ApiError(0, { title: "No answer", detail: "sluice-api could not be reached" });
    });
  }

  /* Every page of a list route (follows next_cursor), up to max entries. */
  function apiAll(path, max) {
    var out = [];
    function page(cursor) {
      var sep = path.indexOf("?") >= 0 ? "&" : "?";
      var p = path + (cursor ? sep + "cursor=" + encodeURIComponent(cursor) : "");
      return api(p).then(function (j) {
        out = out.concat(j.data);
        if (j.next_cursor && out.length < max) { return page(j.next_cursor); }
        return { data: out, first: j };
      });
    }
    return page(null);
  }

  function failed(e) {
    status(e && e.message ? e.message : String(e), "error");
    if (e && e.status === 401 && getKey()) {
      /* unknown, revoked or mistyped: drop it and ask again */
      window.sessionStorage.removeItem(KEY_STORE);
      showKeyState();
      $("key-input").focus();
    }
  }

  /* ==== DOM helpers ==== */

  /* el("td", {className: "num"}, "text", childNode, ...) */
  function el(tag, props) {
    var n = document.createElement(tag);
    var k;
    for (k in props || {}) {
      if (Object.prototype.hasOwnProperty.call(props, k)) {
        if (k.indexOf("data-") === 0 || k.indexOf("aria-") === 0 || k === "scope" || k === "role") {
          n.setAttribute(k, props[k]);
        } else {
          n[k] = props[k];
        }
      }
    }
    for (var i = 2; i < arguments.length; i++) {
      var c = arguments[i];
      if (c === null || c === undefined) { continue; }
      n.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return n;
  }

  function clear(n) { while (n.firstChild) { n.removeChild(n.firstChild); } }

  function emptyRow(tbody, cols, text) {
    tbody.appendChild(el("tr", null, el("td", { colSpan: cols, className: "empty" }, text)));
  }

  function fmtMs(v) {
    if (v === null || v === undefined) { return "–"; }
    return v >= 1000 ? v.toFixed(0) : v.toFixed(1);
  }

  /* per second: three significant digits below 1 (0.00556), one decimal above */
  function fmtRate(v) {
    if (v === 0) { return "0"; }
    return v >= 1 ? v.toFixed(1) : v.toPrecision(3);
  }

  /* RFC 3339 from the API -> "2026-12-02 09:15:04" (UTC, as every time in the console) */
  function fmtTime(t) {
    if (!t) { return "–"; }
    return t.replace("T", " ").replace(/\.\d+Z$/, "").replace(/Z$/, "");
  }

  /* "1 delivery", "3 deliveries" */
  function count(n, one, many) { return n + " " + (n === 1 ? one : many); }

  function windowLabel(sel) {
    return sel.options[sel.selectedIndex] ? sel.options[sel.selectedIndex].text : "";
  }

  /* ==== page: endpoints ==== */

  function breakerCell(b) {
    var cls = b.state === "closed" ? "ok" : b.state === "unknown" ? "warn" : "bad";
    var label = b.state === "half_open" ? "half-open" : b.state;
    var td = el("td", { "data-breaker": b.state }, el("span", { className: "badge " + cls }, label));
    if (b.state === "open" && b.reopen_at) {
      td.appendChild(document.createTextNode(" until " + fmtTime(b.reopen_at)));
    }
    if (b.failures) {
      td.appendChild(document.createTextNode(" (" + b.failures + " failure" +
                                             (b.failures === 1 ? ")" : "s)")));
    }
    return td;
  }

  function lastErrorText(le) {
    if (!le) { return "–"; }
    return le.error + (le.status !== null ? " " + le.status : " (no response)") + " at " +
      fmtTime(le.at);
  }

  /*
   * Test: POST /v1/endpoints/{id}/test (publish scope), then its delivery log until the
   * endpoint has answered (a deferral is not an answer: breaker open, rate limit) or 30 s
   * went by: the outcome in the live region, then the table reloaded (quietly: the status
   * keeps the outcome) so that the row counts the test. While a test runs its endpoint's
   * button stays disabled, across reloads of the table (testing); focus goes back to the
   * row's button when the reload left it nowhere.
   */
  var testing = {};

  function rowButton(id) {
    return document.querySelector("#endpoints tr[data-endpoint=\"" + CSS.escape(id) +
                                  "\"] button.test");
  }

  function testEndpoint(id) {
    var deadline = Date.now() + 30000;
    var left = function () { return Math.max(1000, deadline - Date.now()); };
    var end = function () {
      delete testing[id];
      var b = rowButton(id);
      if (b) { b.disabled = false; }
    };
    testing[id] = true;
    var first = rowButton(id);
    if (first) { first.disabled = true; }
    status("Sending a test event to " + id + "…");
    return api("/v1/endpoints/" + encodeURIComponent(id) + "/test", {}, left()).then(function (ev) {
      var what = "Test event " + ev.id + " to " + id;
      function poll() {
        return api("/v1/events/" + encodeURIComponent(ev.id) + "/deliveries", null, left())
          .then(function (d) {
            var e = d.data.filter(function (x) { return x.endpoint === id; })[0];
            var log = e ? e.attempts_log : [];
            var last = log.length ? log[log.length - 1] : null;
            var answered = last && last.state !== "deferred";
            if (!answered && Date.now() < deadline) {
              status(what + ": sent; " + (last ? "deferred (" + (last.error || "?") + ")" :
                     "waiting for its answer") + "…");
              return new Promise(function (ok) { setTimeout(ok, 1000); }).then(poll);
            }
            end();
            if (!answered) {
              status(what + ": no answer recorded within 30 s" +
                     (last ? " (deferred: " + (last.error || "?") + ")" : "") +
                     "; see the Event search page.", "error");
            } else if (last.state === "delivered") {
              status(what + ": delivered, HTTP " + last.http_status + " in " +
                     fmtMs(last.latency_ms) + " ms.", "ok");
            } else {
              status(what + ": " + last.state + " (" + (last.error || "?") +
                     (last.http_status ? " " + last.http_status : "") +
                     /* the message of a bare status is its class again: said once */
                     (last.message && last.message !== last.error ? ": " + last.message : "") +
                     ").", "error");
            }
            return loadEndpoints(true).then(function () {
              var a = document.activeElement, again = rowButton(id);
              if (again && (!a || a === document.body)) { again.focus(); }
            });
          }, function (e) {
            end();
            status(what + ": sent, but its answer could not be read (" +
                   (e && e.message ? e.message : String(e)) + ").", "error");
          });
      }
      return poll();
    }, function (e) { end(); failed(e); });
  }

  function testButton(id) {
    var b = el("button", { type: "button", className: "test", disabled: !!testing[id],
                           "aria-label": "Send a test event to " + id }, "Test");
    b.addEventListener("click", function () { testEndpoint(id); });
    return b;
  }

  /* quiet: the status line is left as it is (a reload after a test keeps its outcome); a
   * quiet reload that fails leaves the table as it was */
  function loadEndpoints(quiet) {
    quiet = quiet === true;
    var sel = $("window");
    var tbody = document.querySelector("#endpoints tbody");
    if (!quiet) { status("Loading endpoints…"); }
    return apiAll("/v1/endpoint-stats?limit=500&window_s=" + encodeURIComponent(sel.value), 10000)
      .then(function (res) {
        var first = res.first;
        $("window-label").textContent = windowLabel(sel);
        $("slow-ms").textContent = String(first.slow_threshold_ms);
        $("slow-min").textContent = String(first.slow_min_samples);
        clear(tbody);
        var slow = 0;
        res.data.forEach(function (e) {
          var link = el("a", { href: "/console/latency.html#endpoint=" + encodeURIComponent(e.id) },
                        e.id);
          var tr = el("tr", { "data-endpoint": e.id, "data-slow": String(e.slow) },
            el("th", { scope: "row" }, link, e.name ? el("div", { className: "help" }, e.name) : null),
            el("td", null, e.enabled ? "enabled" : "disabled",
               e.disabled_reason ? el("div", { className: "help" }, e.disabled_reason) : null),
            breakerCell(e.breaker),
            el("td", { className: "num" }, fmtRate(e.delivered_per_s)),
            el("td", { className: "num" }, e.delivered),
            el("td", { className: "num" }, e.attempts),
            el("td", { className: "num" }, e.failures),
            el("td", { className: "num" }, fmtMs(e.latency.p50_ms)),
            el("td", { className: "num" }, fmtMs(e.latency.p95_ms)),
            el("td", { className: "num" }, fmtMs(e.latency.p99_ms)),
            el("td", null, e.slow ? el("span", { className: "slow-badge" }, "slow") : "no"),
            el("td", null, lastErrorText(e.last_error)),
            el("td", null, e.enabled ? testButton(e.id) : "–"));
          if (e.slow) { tr.classList.add("is-slow"); slow++; }
          if (!e.enabled) { tr.classList.add("is-disabled"); }
          tbody.appendChild(tr);
        });
        if (!res.data.length) { emptyRow(tbody, 13, "No endpoints."); }
        if (!quiet) {
          status("Loaded " + count(res.data.length, "endpoint", "endpoints") + " (" + slow +
                 " slow) over the " + windowLabel(sel) + ".", "ok");
        }
      }, quiet ? function () {} : failed);
  }

  function pageEndpoints() {
    $("controls").addEventListener("submit", function (ev) {
      ev.preventDefault();
      loadEndpoints();
    });
    return loadEndpoints;
  }

  /* ==== page: latency ==== */

  var chart = null;

  /* A value of the page's #hash; "" when absent or not valid percent-encoding (a link cut
   * short must not stop the page before it has even read the stored key). */
  function hashParam(name) {
    var m = new RegExp("(?:^|[#&])" + name + "=([^&]*)").exec(window.location.hash);
    if (!m) { return ""; }
    try {
      return decodeURIComponent(m[1]);
    } catch (e) {
      return "";
    }
  }

  function drawChart(j) {
    var box = $("chart");
    var xs = [], p50 = [], p95 = [], p99 = [];
    var points = 0;
    j.buckets.forEach(function (b) {
      xs.push(Date.parse(b.t) / 1000);
      p50.push(b.p50_ms);
      p95.push(b.p95_ms);
      p99.push(b.p99_ms);
      if (b.count > 0) { points++; }
    });
    if (chart) { chart.destroy(); chart = null; }
    clear(box);
    var fig = $("chart-figure");
    fig.setAttribute("data-points", String(points));
    fig.setAttribute("data-samples", String(j.samples));
    var mins = Math.round(j.bucket_s / 60);
    var summary = "P50, P95 and P99 latency (ms) of " + j.endpoint + " per " +
      (j.bucket_s % 60 === 0 ? mins + "-minute" : j.bucket_s + "-second") +
      " bucket over the " + windowLabel($("window")) + ": " + j.samples + " samples in " +
      points + (points === 1 ? " bucket" : " buckets") + " (times in UTC).";
    $("chart-caption").textContent = summary;
    if (typeof window.uPlot !== "function") {
      status("The chart library did not load; the data table below has the figures.", "error");
      return;
    }
    var opts = {
      width: Math.max(320, box.clientWidth || 800),
      height: 320,
      tzDate: function (ts) { return window.uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      /* latencies from 0, so the height of a point means what it looks like */
      scales: { x: { time: true },
                y: { range: function (u, min, max) { return [0, max > 0 ? max * 1.1 : 1]; } } },
      series: [
        { label: "Bucket (UTC)" },
        { label: "P50 ms", stroke: "#0b4f8a", width: 2, points: { show: true, size: 8 } },
        { label: "P95 ms", stroke: "#a14a00", width: 2, dash: [8, 4],
          points: { show: true, size: 8 } },
        { label: "P99 ms", stroke: "#8a1414", width: 2, dash: [2, 4],
          points: { show: true, size: 8 } }
      ],
      axes: [{}, { label: "ms" }]
    };
    chart = new window.uPlot(opts, [xs, p50, p95, p99], box);
  }

  function fillTrendTable(j) {
    var tbody = document.querySelector("#trend tbody");
    clear(tbody);
    j.buckets.forEach(function (b) {
      if (b.count === 0) { return; }
      tbody.appendChild(el("tr", null,
        el("th", { scope: "row" }, fmtTime(b.t)),
        el("td", { className: "num" }, b.count),
        el("td", { className: "num" }, fmtMs(b.p50_ms)),
        el("td", { className: "num" }, fmtMs(b.p95_ms)),
        el("td", { className: "num" }, fmtMs(b.p99_ms))));
    });
    if (!tbody.firstChild) { emptyRow(tbody, 5, "No samples in the window."); }
  }

  function loadTrend() {
    var ep = $("endpoint").value;
    if (!ep) { return Promise.resolve(); }
    status("Loading the latency of " + ep + "…");
    var path = "/v1/endpoints/" + encodeURIComponent(ep) + "/latency?window_s=" +
      encodeURIComponent($("window").value);
    return api(path).then(function (j) {
      drawChart(j);
      fillTrendTable(j);
      status("Latency of " + ep + ": " + j.samples + " samples.", "ok");
    }, failed);
  }

  function loadLatency() {
    var sel = $("endpoint");
    status("Loading endpoints…");
    return apiAll("/v1/endpoints?limit=500", 10000).then(function (res) {
      var want = hashParam("endpoint") || sel.value;
      clear(sel);
      res.data.forEach(function (e) {
        sel.appendChild(el("option", { value: e.id, selected: e.id === want }, e.id));
      });
      if (!res.data.length) {
        status("No endpoints.", "ok");
        return null;
      }
      if (want && sel.value !== want) {
        /* the link named an endpoint this key does not see (or none has that id): say so
         * rather than show another endpoint's trend as if it were the one asked for */
        status("No endpoint " + want + " (or this key may not see it): pick one and press Show.",
               "error");
        return null;
      }
      return loadTrend();
    }, failed);
  }

  function pageLatency() {
    $("controls").addEventListener("submit", function (ev) {
      ev.preventDefault();
      window.history.replaceState(null, "", "#endpoint=" + encodeURIComponent($("endpoint").value));
      loadTrend();
    });
    window.addEventListener("hashchange", function () {
      var ep = hashParam("endpoint");
      if (ep && getKey()) {
        $("endpoint").value = ep;
        loadTrend();
      }
    });
    window.addEventListener("resize", function () {
      if (chart) { chart.setSize({ width: Math.max(320, $("chart").clientWidth), height: 320 }); }
    });
    return loadLatency;
  }

  /* ==== page: dead letters ==== */

  var lettersCursor = null;
  var lettersEndpoint = ""; /* the filter the shown pages were read with: "more" keeps it */

  /* Ask in the dialog; resolves true when confirmed. */
  function confirmDialog(text, okLabel) {
    var dlg = $("confirm");
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = okLabel;
    var opener = document.activeElement;
    return new Promise(function (resolve) {
      function done(v) {
        $("confirm-ok").removeEventListener("click", yes);
        $("confirm-cancel").removeEventListener("click", no);
        dlg.removeEventListener("cancel", no);
        if (dlg.open) { dlg.close(); }
        if (opener && opener.focus) { opener.focus(); }
        resolve(v);
      }
      function yes() { done(true); }
      function no(ev) { if (ev) { ev.preventDefault(); } done(false); }
      $("confirm-ok").addEventListener("click", yes);
      $("confirm-cancel").addEventListener("click", no);
      dlg.addEventListener("cancel", no);
      dlg.showModal();
      $("confirm-cancel").focus();
    });
  }

  /*
   * Replay: a dry run first (what would go, and whether this key may replay at all: 403
   * otherwise), then the confirmation, then the run. The server sends each letter once, so
   * pressing the button twice sends nothing the second time.
   */
  function replay(sel, what) {
    status("Checking what a replay of " + what + " would send…");
    var dry = Object.assign({ dry_run: true }, sel);
    return api("/v1/dead-letters/replay", dry).then(function (d) {
      if (d.would_replay === 0) {
        status(d.unregistered > 0
          ? "Nothing to replay for " + what + ": " + count(d.unregistered, "letter belongs",
            "letters belong") + " to an endpoint no longer registered (register it again " +
            "to replay them)."
          : "Nothing to replay for " + what + ": every letter was replayed already.", "ok");
        return null;
      }
      var n = d.would_replay;
      var text = "Send " + count(n, "dead letter", "dead letters") + " of " + what +
        " again? Each is sent once; letters replayed already are not sent again.";
      status("Confirm the replay of " + what + " in the dialog.");
      return confirmDialog(text, "Replay " + n).then(function (yes) {
        if (!yes) {
          status("Replay cancelled; nothing was sent.", "ok");
          return null;
        }
        status("Replaying " + what + "…");
        return api("/v1/dead-letters/replay", sel).then(function (res) {
          status("Replayed " + count(res.replayed, "dead letter", "dead letters") +
                 " of " + what + " (failed " + res.failed + ", without payload " +
                 res.without_payload + ").", res.failed ? "error" : "ok");
          return loadDead(true);
        });
      });
    }).catch(failed);
  }

  function replayButton(label, aria, sel, what) {
    var b = el("button", { type: "button", "aria-label": aria }, label);
    b.addEventListener("click", function () { replay(sel, what); });
    return b;
  }

  function fillPatterns(rows) {
    var tbody = document.querySelector("#patterns tbody");
    clear(tbody);
    rows.forEach(function (p) {
      var pats = p.patterns.length ? p.patterns.join(", ") : "none";
      tbody.appendChild(el("tr", { "data-endpoint": p.endpoint },
        el("th", { scope: "row" }, p.endpoint),
        el("td", { className: "num" }, p.dead_letters),
        el("td", { className: "num" }, p.unreplayed),
        el("td", null, (p.top_error || "–") + " (" + p.top_error_count + ")"),
        el("td", null, (p.top_status === null ? "no response" : p.top_status) + " (" +
           p.top_status_count + ")"),
        el("td", null, fmtTime(p.first_dead_at)),
        el("td", null, fmtTime(p.last_dead_at)),
        el("td", { className: "num" }, p.avg_attempts.toFixed(2)),
        el("td", { "data-patterns": p.patterns.join("|") }, pats),
        el("td", null, replayButton("Replay all", "Replay the unreplayed dead letters of " +
                                    p.endpoint, { endpoint: p.endpoint }, "endpoint " + p.endpoint))));
    });
    if (!rows.length) { emptyRow(tbody, 10, "No dead letters in the window."); }
  }

  /* What the endpoint answered last (admin keys only: null for others, and for no body):
   * its text, cut at 200 characters with the whole in the title, or the size of a body that
   * is not text. Shown as text nodes, never as markup. */
  function responseCell(d) {
    var t = d.last_response, b = d.last_response_base64;
    if (t !== null && t !== undefined && t !== "") {
      var shown = t.length > 200 ? t.slice(0, 200) + "…" : t;
      return el("td", { className: "resp", title: t }, el("code", null, shown));
    }
    if (b) {
      var n = Math.floor(b.length / 4) * 3 - (b.match(/=*$/)[0].length);
      return el("td", { className: "resp" }, "binary, " + n + " bytes");
    }
    return el("td", { className: "resp" }, "–");
  }

  function appendLetters(rows) {
    var tbody = document.querySelector("#letters tbody");
    rows.forEach(function (d) {
      tbody.appendChild(el("tr", { "data-event": d.event_id, "data-endpoint": d.endpoint },
        el("th", { scope: "row" },
           el("a", { href: "/console/events.html#id=" + encodeURIComponent(d.event_id) },
              d.event_id)),
        el("td", null, d.endpoint),
        el("td", null, d.type || "–"),
        el("td", null, d.error || "–"),
        el("td", null, d.last_status === null ? "no response" : d.last_status),
        responseCell(d),
        el("td", { className: "num" }, d.attempts),
        el("td", null, fmtTime(d.dead_at)),
        el("td", null, d.replayed_at ? fmtTime(d.replayed_at) + " (" + d.replay_count + "×)" : "–"),
        el("td", null, replayButton("Replay", "Replay dead letter " + d.event_id + " of " +
                                    d.endpoint, { endpoint: d.endpoint, event_ids: [d.event_id] },
                                    "event " + d.event_id + " at " + d.endpoint))));
    });
  }

  function loadLetters(more) {
    /* a cursor is valid only with the filters of its first page (the API refuses others) */
    var ep = more ? lettersEndpoint : $("endpoint").value;
    lettersEndpoint = ep;
    var tbody = document.querySelector("#letters tbody");
    var path = "/v1/dead-letters?limit=50" + (ep ? "&endpoint=" + encodeURIComponent(ep) : "") +
      (more && lettersCursor ? "&cursor=" + encodeURIComponent(lettersCursor) : "");
    return api(path).then(function (j) {
      if (!more) { clear(tbody); }
      appendLetters(j.data);
      lettersCursor = j.next_cursor;
      $("letters-more").hidden = !lettersCursor;
      if (!tbody.firstChild) { emptyRow(tbody, 10, "No unresolved dead letters."); }
      $("letters-caption").textContent = "Newest first" + (ep ? ", endpoint " + ep : "") +
        ". Response: the start of the body the endpoint answered last (shown to admin keys).";
      return j.data.length;
    });
  }

  /* keepStatus: after a replay, leave its result in the live region */
  function loadDead(keepStatus) {
    var ep = $("endpoint").value;
    var win = $("window").value;
    if (!keepStatus) { status("Loading dead letters…"); }
    var pat = apiAll("/v1/dead-letters/patterns?limit=500&window_s=" + encodeURIComponent(win) +
                     (ep ? "&endpoint=" + encodeURIComponent(ep) : ""), 10000);
    return Promise.all([pat, loadLetters(false)]).then(function (r) {
      fillPatterns(r[0].data);
      var sel = $("endpoint");
      r[0].data.forEach(function (p) {
        var have = Array.prototype.some.call(sel.options, function (o) { return o.value === p.endpoint; });
        if (!have) { sel.appendChild(el("option", { value: p.endpoint }, p.endpoint)); }
      });
      if (!keepStatus) {
        status("Loaded dead letters of " + count(r[0].data.length, "endpoint", "endpoints") +
               " over the " +
               windowLabel($("window")) + ".", "ok");
      }
    }).catch(failed);
  }

  function pageDead() {
    var ep = hashParam("endpoint");
    if (ep) { $("endpoint").appendChild(el("option", { value: ep, selected: true }, ep)); }
    $("controls").addEventListener("submit", function (ev) {
      ev.preventDefault();
      loadDead(false);
    });
    $("letters-more").addEventListener("click", function () {
      loadLetters(true).catch(failed);
    });
    return function () { return loadDead(false); };
  }

  /* ==== page: event search ==== */

  function phases(p) {
    var parts = [];
    if (p.dns_ms !== null) { parts.push("DNS " + fmtMs(p.dns_ms)); }
    if (p.connect_ms !== null) { parts.push("connect " + fmtMs(p.connect_ms)); }
    if (p.tls_ms !== null) { parts.push("TLS " + fmtMs(p.tls_ms)); }
    if (p.first_byte_ms !== null) { parts.push("first byte " + fmtMs(p.first_byte_ms)); }
    return parts.length ? parts.join(", ") : "–";
  }

  function deliverySection(d, i) {
    var hid = "delivery-" + i;
    var rows = d.attempts_log.map(function (a) {
      return el("tr", { "data-attempt": a.attempt, "data-state": a.state },
        el("th", { scope: "row", className: "num" }, a.attempt),
        el("td", null, a.state),
        el("td", null, a.http_status === null ? "no response" : a.http_status),
        el("td", null, a.error || "–"),
        el("td", null, fmtTime(a.at)),
        el("td", { className: "num" }, fmtMs(a.latency_ms)),
        el("td", null, phases(a.phases)),
        el("td", null, fmtTime(a.next_attempt_at)),
        el("td", null, a.pod || "–"));
    });
    var head = el("tr", null);
    ["Attempt", "State", "HTTP status", "Error", "At (UTC)", "Latency ms", "Phases ms",
     "Next attempt (UTC)", "Consumer"].forEach(function (h) {
      head.appendChild(el("th", { scope: "col" }, h));
    });
    var table = el("table", { "data-endpoint": d.endpoint },
      el("caption", null, "Every outcome for " + d.endpoint + ", oldest first"),
      el("thead", null, head), el("tbody", null));
    rows.forEach(function (r) { table.tBodies[0].appendChild(r); });
    return el("section", { className: "delivery", "aria-labelledby": hid, "data-endpoint": d.endpoint },
      el("h2", { id: hid }, d.endpoint + ": " + d.state),
      el("dl", null,
         el("dt", null, "Type"), el("dd", null, d.type || "–"),
         el("dt", null, "Attempts spent"), el("dd", null, d.attempts),
         el("dt", null, "First seen (UTC)"), el("dd", null, fmtTime(d.first_seen)),
         el("dt", null, "Delivered (UTC)"), el("dd", null, fmtTime(d.delivered_at)),
         el("dt", null, "Last status"), el("dd", null, d.last_status === null ? "–" : d.last_status),
         el("dt", null, "Last error"), el("dd", null, d.last_error || "–")),
      el("div", { className: "scroll", role: "region", "aria-label": "Attempts at " + d.endpoint,
                  tabIndex: 0 }, table));
  }

  function search(id) {
    var out = $("results");
    clear(out); /* an error must not leave the previous event's deliveries on show */
    status("Searching for event " + id + "…");
    return apiAll("/v1/events/" + encodeURIComponent(id) + "/deliveries?limit=500", 10000)
      .then(function (res) {
        clear(out);
        out.appendChild(el("h2", { className: "visually-hidden" }, "Deliveries of " + id));
        res.data.forEach(function (d, i) { out.appendChild(deliverySection(d, i)); });
        var n = res.data.reduce(function (s, d) { return s + d.attempts_log.length; }, 0);
        if (!res.data.length) {
          out.appendChild(el("p", { className: "empty" }, "No deliveries recorded for " + id +
            " (yet: the history trails the pipeline by a moment)."));
        }
        status("Event " + id + ": " + count(res.data.length, "delivery", "deliveries") + ", " +
               count(n, "outcome", "outcomes") + ".", "ok");
      }, failed);
  }

  function pageEvents() {
    var input = $("event-id");
    $("search").addEventListener("submit", function (ev) {
      ev.preventDefault();
      var id = input.value.trim();
      if (!id) { return; }
      window.history.replaceState(null, "", "#id=" + encodeURIComponent(id));
      search(id);
    });
    var first = hashParam("id");
    if (first) { input.value = first; }
    window.addEventListener("hashchange", function () {
      var id = hashParam("id");
      if (id && getKey()) {
        input.value = id;
        search(id);
      }
    });
    return function () {
      var id = input.value.trim();
      return id ? search(id) : Promise.resolve();
    };
  }

  /* ==== start ==== */

  var pages = { endpoints: pageEndpoints, latency: pageLatency, "dead-letters": pageDead,
                events: pageEvents };

  function start() {
    var setup = pages[document.body.getAttribute("data-page")];
    var load = setup ? setup() : function () { return Promise.resolve(); };
    setupKey(load);
    if (getKey()) {
      load();
    } else {
      status("Enter an API key (scope read) to load the data.");
      $("key-input").focus();
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
