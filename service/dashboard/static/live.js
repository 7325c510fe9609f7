// Crucible dashboard: live panels. An element with data-src is re-fetched every
// data-interval-ms milliseconds and its HTML replaced (same origin, session cookie).
// A redirect (the session ended) reloads the page, which leads to the sign-in form.
"use strict";
(function () {
  function poll(el) {
    var every = parseInt(el.getAttribute("data-interval-ms"), 10) || 3000;
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) { return; }
      busy = true;
      fetch(el.getAttribute("data-src"), { credentials: "same-origin", cache: "no-store" })
        .then(function (res) {
          if (res.redirected || res.status === 401) { window.location.reload(); return null; }
          return res.ok ? res.text() : null;
        })
        .then(function (html) { if (html !== null) { el.innerHTML = html; } })
        .catch(function () { /* keep the last panel; the next tick retries */ })
        .then(function () { busy = false; });
    }, every);
  }
  // Events (server-sent, /dashboard/live/events) refresh the panels at once; the polling
  // above stays as the fallback when the stream is down.
  function follow(panels) {
    if (!window.EventSource || panels.length === 0) { return; }
    var due = null;
    var events = new EventSource("/dashboard/live/events");
    function refresh() {
      if (due !== null) { return; }
      due = setTimeout(function () {
        due = null;
        panels.forEach(function (el) {
          fetch(el.getAttribute("data-src"), { credentials: "same-origin", cache: "no-store" })
            .then(function (res) { return res.ok && !res.redirected ? res.text() : null; })
            .then(function (html) { if (html !== null) { el.innerHTML = html; } })
            .catch(function () { /* the next poll retries */ });
        });
      }, 250);
    }
    ["sandbox.lease", "sandbox.release", "sandbox.expire", "sandbox.fail", "pool.refill",
     "record.stored", "job.create", "job.complete", "gap"].forEach(function (name) {
      events.addEventListener(name, refresh);
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var panels = Array.prototype.slice.call(document.querySelectorAll("[data-src]"));
    panels.forEach(poll);
    follow(panels);
  });
})();
