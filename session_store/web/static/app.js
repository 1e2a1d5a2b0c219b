// The call page's behaviour: the state inspector (a click on an event shows the call's
// projection right after it, from /api/state/ID?at=V, and puts ?at=V in the URL), deep links
// (?at=V and #vV select an event on load), and the live view of an open call (server-sent
// events from /api/live/ID; on each new event the page's live part is fetched again, and
// "no event for N s" counts up between events).
// Everything from the server's JSON is inserted with textContent: data never becomes markup.
(function () {
  "use strict";
  var body = document.body;
  var stateUrl = body.getAttribute("data-state-url");
  if (!stateUrl) { return; }
  var redact = body.getAttribute("data-redact") === "1";
  var panel = document.getElementById("state-body");
  var selected = [];
  var current = null;

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    if (cls) { node.className = cls; }
    return node;
  }

  function words(value) {
    if (value === null || value === undefined) { return "–"; }
    if (value === true) { return "yes"; }
    if (value === false) { return "no"; }
    return String(value);
  }

  function list(title, items) {
    var p = el("p");
    p.appendChild(el("b", title + ": "));
    p.appendChild(el("span", items && items.length ? items.join(", ") : "none",
                     items && items.length ? "warn" : "muted"));
    return p;
  }

  function render(s) {
    panel.textContent = "";
    var head = el("h3", "after version " + s.version);
    head.id = "state-version";
    panel.appendChild(head);
    if (s.event) {
      panel.appendChild(el("p", s.event.type + " at " + s.event.recorded_at, "mono"));
    }
    var facts = el("table", null, "facts-table");
    [["worker", s.worker], ["epoch", s.epoch], ["generation", s.generation],
     ["connected", s.connected], ["bot speaking", s.bot_speaking],
     ["reconnect pending", s.reconnect_pending], ["newest handle", s.newest_handle],
     ["closed", s.closed]].forEach(function (row) {
      var tr = el("tr");
      tr.appendChild(el("th", row[0]));
      tr.appendChild(el("td", words(row[1])));
      facts.appendChild(tr);
    });
    panel.appendChild(facts);
    panel.appendChild(list("deferred", s.deferred));
    panel.appendChild(list("running", s.running));
    panel.appendChild(list("in doubt", s.in_doubt));
    panel.appendChild(list("to send", s.to_send));
    panel.appendChild(list("unanswered", s.unanswered));
    if (s.tool_calls.length) {
      var t = el("table", null, "calls-table");
      var hr = el("tr");
      ["tool call", "tool", "status", "in current session"].forEach(function (h) {
        hr.appendChild(el("th", h));
      });
      t.appendChild(hr);
      s.tool_calls.slice(-50).forEach(function (c) {
        var tr = el("tr");
        tr.appendChild(el("td", c.tool_call_id, "mono"));
        tr.appendChild(el("td", c.name));
        tr.appendChild(el("td", c.status));
        tr.appendChild(el("td", words(c.in_current_session),
                          c.in_current_session ? "" : "warn"));
        t.appendChild(tr);
      });
      panel.appendChild(t);
    }
    var details = el("details");
    details.appendChild(el("summary", "full state and event (JSON)"));
    details.appendChild(el("pre", JSON.stringify(s, null, 2)));
    panel.appendChild(details);
  }

  function mark(version) {
    selected.forEach(function (n) { n.classList.remove("selected"); });
    selected = Array.prototype.slice.call(document.querySelectorAll('[data-v="' + version + '"]'));
    selected.forEach(function (n) { n.classList.add("selected"); });
  }

  function show(version, scroll) {
    current = String(version);
    mark(current);
    var row = document.getElementById("v" + current);
    if (scroll && row && row.scrollIntoView) { row.scrollIntoView({block: "center"}); }
    panel.textContent = "loading…";
    var url = stateUrl + (stateUrl.indexOf("?") < 0 ? "?" : "&") + "at=" +
      encodeURIComponent(current) + (redact ? "&redact=1" : "");
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(render)
      .catch(function (err) { panel.textContent = "could not load the state: " + err.message; });
  }

  // A click selects an event and puts it in the URL (?at=V): a link a ticket can hold.
  function select(version) {
    var url = new URL(window.location.href);
    url.searchParams.set("at", version);
    url.searchParams.delete("from");
    url.hash = "";
    window.history.replaceState(null, "", url.toString());
    show(version, false);
  }

  document.addEventListener("click", function (ev) {
    var target = ev.target.closest ? ev.target.closest("[data-v]") : null;
    if (!target || (ev.target.closest && ev.target.closest("a"))) { return; }
    select(target.getAttribute("data-v"));
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && ev.target.getAttribute && ev.target.getAttribute("data-v")) {
      select(ev.target.getAttribute("data-v"));
    }
  });

  // Deep links: ?at=V (the server shows the window holding V), or #vV (this window, or the
  // one the server finds for ?at=V).
  var params = new URLSearchParams(window.location.search);
  var hash = /^#v(\d+)$/.exec(window.location.hash);
  if (hash) {
    if (document.getElementById("v" + hash[1])) {
      show(hash[1], true);
    } else {
      var there = new URL(window.location.href);
      there.searchParams.set("at", hash[1]);
      there.searchParams.delete("from");
      there.hash = "";
      window.location.replace(there.toString());
      return;
    }
  } else if (params.get("at")) {
    show(params.get("at"), true);
  }

  // ------------------------------------------------------------------ live
  var liveUrl = body.getAttribute("data-live-url");
  var partUrl = body.getAttribute("data-part-url");
  var silence = document.getElementById("silence");
  var statusLabel = document.getElementById("call-status");
  var open = body.getAttribute("data-call-open") === "1";
  var lastEventUs = Number(body.getAttribute("data-last-event-us"));
  // The server's clock, not the browser's: "no event for N s" must not depend on skew.
  var skewMs = Number(body.getAttribute("data-now-us")) / 1000 - Date.now();

  function tick() {
    if (!open || !silence) { if (silence) { silence.textContent = ""; } return; }
    var seconds = Math.max(0, Math.floor((Date.now() + skewMs - lastEventUs / 1000) / 1000));
    silence.textContent = seconds >= 1 ? "no event for " + seconds + " s" : "";
  }

  var fetching = false, again = false;
  function refresh() {
    if (fetching) { again = true; return; }
    fetching = true;
    var here = new URLSearchParams(window.location.search);
    here.set("part", "live");
    var url = partUrl + (partUrl.indexOf("?") < 0 ? "?" : "&") + here.toString();
    fetch(url, {credentials: "same-origin"})
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var live = document.getElementById("live");
        live.replaceChildren.apply(live, Array.prototype.slice.call(doc.body.childNodes));
        if (current) { mark(current); }
      })
      .catch(function () { /* the next event tries again */ })
      .then(function () {
        fetching = false;
        if (again) { again = false; refresh(); }
      });
  }

  if (open && liveUrl && window.EventSource) {
    var source = new EventSource(liveUrl);
    source.addEventListener("update", function (msg) {
      var u = JSON.parse(msg.data);
      if (u.last_event_at) { lastEventUs = Date.parse(u.last_event_at) * 1000; }
      if (statusLabel) {
        statusLabel.textContent = u.status;
        statusLabel.className = "status " + u.status;
      }
      if (u.entries.length) { refresh(); }
      if (u.status === "closed") {
        open = false;
        source.close();
        refresh();
      }
      tick();
    });
    body.setAttribute("data-live", "connected");
  }
  tick();
  window.setInterval(tick, 1000);
})();
