// The state inspector: a click on an event (table row or lane mark) shows the call's
// projection right after that event, fetched from /api/calls/{id}/state?at=V.
// Everything is inserted with textContent: data never becomes markup.
(function () {
  "use strict";
  var body = document.body;
  var stateUrl = body.getAttribute("data-state-url");
  if (!stateUrl) { return; }
  var redact = body.getAttribute("data-redact") === "1";
  var panel = document.getElementById("state-body");
  var selected = [];

  function el(tag, text, cls) {
    var node = document.createElement(tag);
    if (text !== undefined && text !== null) { node.textContent = String(text); }
    if (cls) { node.className = cls; }
    return node;
  }

  function list(title, items) {
    var p = el("p");
    p.appendChild(el("b", title + ": "));
    p.appendChild(el("span", items && items.length ? items.join(", ") : "none",
                     items && items.length ? "warn" : "muted"));
    return p;
  }

  function render(data) {
    var s = data.state;
    panel.textContent = "";
    var head = el("h3", "after version " + data.at);
    head.id = "state-version";
    panel.appendChild(head);
    if (data.event) {
      panel.appendChild(el("p", data.event.type + " at " + data.event.recorded_at, "mono"));
    }
    var facts = el("table", null, "facts-table");
    [["worker", s.worker], ["epoch", s.epoch], ["generation", s.generation],
     ["connected", s.connected], ["bot speaking", s.bot_speaking],
     ["reconnect pending", s.reconnect_pending], ["newest handle", s.newest_handle],
     ["closed", s.closed]].forEach(function (row) {
      var tr = el("tr");
      tr.appendChild(el("th", row[0]));
      tr.appendChild(el("td", row[1] === null ? "–" : row[1]));
      facts.appendChild(tr);
    });
    panel.appendChild(facts);
    panel.appendChild(list("deferred", s.deferred));
    panel.appendChild(list("running", s.running));
    panel.appendChild(list("in doubt", s.in_doubt));
    panel.appendChild(list("undelivered", s.undelivered));
    panel.appendChild(list("unanswered", s.unanswered));
    var ids = Object.keys(s.calls);
    if (ids.length) {
      var t = el("table", null, "calls-table");
      var hr = el("tr");
      ["call", "tool", "status", "delivered"].forEach(function (h) { hr.appendChild(el("th", h)); });
      t.appendChild(hr);
      ids.slice(-50).forEach(function (id) {
        var c = s.calls[id], tr = el("tr");
        tr.appendChild(el("td", id, "mono"));
        tr.appendChild(el("td", c.name));
        tr.appendChild(el("td", c.status));
        tr.appendChild(el("td", c.delivered ? "yes" : "no", c.delivered ? "" : "warn"));
        t.appendChild(tr);
      });
      panel.appendChild(t);
    }
    var details = el("details");
    details.appendChild(el("summary", "full state and event (JSON)"));
    details.appendChild(el("pre", JSON.stringify({event: data.event, state: s}, null, 2)));
    panel.appendChild(details);
  }

  function show(version, source) {
    selected.forEach(function (n) { n.classList.remove("selected"); });
    selected = Array.prototype.slice.call(document.querySelectorAll('[data-v="' + version + '"]'));
    selected.forEach(function (n) { n.classList.add("selected"); });
    panel.textContent = "loading…";
    var url = stateUrl + "?at=" + encodeURIComponent(version) + (redact ? "&redact=1" : "");
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(render)
      .catch(function (err) { panel.textContent = "could not load the state: " + err.message; });
  }

  document.addEventListener("click", function (ev) {
    var target = ev.target.closest ? ev.target.closest("[data-v]") : null;
    if (!target) { return; }
    show(target.getAttribute("data-v"), target);
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Enter" && ev.target.getAttribute && ev.target.getAttribute("data-v")) {
      show(ev.target.getAttribute("data-v"), ev.target);
    }
  });
})();
