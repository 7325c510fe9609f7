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
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-src]").forEach(poll);
  });
})();
