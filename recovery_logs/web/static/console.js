// Keeps the incident list live: polls /api/incidents and rebuilds the table body with text nodes
// (never innerHTML, so nothing a log line holds can become markup or script).
(function () {
  "use strict";
  var table = document.getElementById("incidents");
  if (!table) { return; }
  var body = table.tBodies[0];
  var live = document.getElementById("live");
  function cell(tr, text) { var td = document.createElement("td"); td.textContent = text; tr.appendChild(td); return td; }
  var last = null;
  function render(data) {
    var key = JSON.stringify([data.mode, data.incidents]);
    live.textContent = "live, updated " + new Date().toLocaleTimeString();
    if (key === last) { return; }          // unchanged: keep the rows (and any element a user is on)
    last = key;
    var rows = document.createDocumentFragment();
    data.incidents.forEach(function (v, n) {
      var tr = document.createElement("tr");
      tr.className = "sev-" + v.severity + " st-" + v.status;
      tr.dataset.id = v.id;
      cell(tr, String(n + 1)); cell(tr, v.severity);
      var a = document.createElement("a"); a.href = "/incidents/" + encodeURIComponent(v.id); a.textContent = v.id;
      cell(tr, "").appendChild(a);
      cell(tr, v.category); cell(tr, v.cause); cell(tr, v.node || "-"); cell(tr, v.job_id || "-");
      cell(tr, v.confidence.toFixed(2)); cell(tr, (v.detected_at || "-").replace("T", " ").slice(0, 23));
      cell(tr, v.status + (v.closed_by ? " (" + v.closed_by + ")" : ""));
      rows.appendChild(tr);
    });
    if (!data.incidents.length) {
      var tr = document.createElement("tr"); tr.className = "none";
      var td = cell(tr, "No incidents."); td.colSpan = 10; rows.appendChild(tr);
    }
    body.replaceChildren(rows);
    document.getElementById("mode").textContent = data.mode;
  }
  function poll() {
    fetch("/api/incidents", {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(render)
      .catch(function (e) { live.textContent = "not live: " + e.message; })
      .finally(function () { window.setTimeout(poll, 2000); });
  }
  window.setTimeout(poll, 2000);
}());
