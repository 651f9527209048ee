// Auto-refresh: every [data-poll] element re-reads its JSON URL every body[data-refresh-ms] ms and
// writes the values into its [data-key] descendants ("total_lag", "queues.0.lag"; data-format
// "1" one decimal, "int" whole, "duration" ms as 1.2s / 3m04s) and [data-html-key] (trusted SVG
// the console drew). No library, no CDN.
(function () {
  "use strict";
  function lookup(value, path) {
    return path.split(".").reduce(function (v, k) { return v == null ? undefined : v[k]; }, value);
  }
  function duration(ms) {
    if (ms <= 0) return "0";
    var s = ms / 1000;
    if (s < 60) return s.toFixed(1) + "s";
    var m = Math.floor(s / 60), h = Math.floor(m / 60);
    return h ? h + "h" + String(m % 60).padStart(2, "0") + "m" : m + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  }
  function show(value, format) {
    if (format === "1") return Number(value).toFixed(1);
    if (format === "int") return String(Math.round(Number(value)));
    if (format === "duration") return duration(Number(value));
    return String(value);
  }
  function refresh(box) {
    fetch(box.getAttribute("data-poll"), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) return;
        box.querySelectorAll("[data-key]").forEach(function (el) {
          var v = lookup(data, el.getAttribute("data-key"));
          if (v !== undefined) el.textContent = show(v, el.getAttribute("data-format"));
        });
        box.querySelectorAll("[data-html-key]").forEach(function (el) {
          var v = lookup(data, el.getAttribute("data-html-key"));
          if (typeof v === "string") el.innerHTML = v;
        });
      })
      .catch(function () { /* the next round tries again */ });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var ms = Number(document.body.getAttribute("data-refresh-ms")) || 5000;
    document.querySelectorAll("[data-poll]").forEach(function (box) {
      setInterval(function () { refresh(box); }, ms);
    });
  });
})();
