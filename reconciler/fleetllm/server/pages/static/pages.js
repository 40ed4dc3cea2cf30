// Auto-refresh without full reloads: fetch this page's live region (?fragment=1, rendered by the
// server like the page itself) and swap it in. Paused while the tab is hidden or the user is
// choosing something in a form. Without JavaScript the page reloads itself (<noscript> meta refresh).
(function () {
  "use strict";
  document.documentElement.classList.add("js");
  var live = document.getElementById("live");
  var status = document.getElementById("refresh-status");
  if (!live) { return; }
  var every = Math.max(5, Number(live.getAttribute("data-refresh")) || 15) * 1000;
  var timer = null;

  function say(text) { if (status) { status.textContent = text; } }

  function busy() {
    var active = document.activeElement;
    if (active && live.contains(active) && active.matches("input, select, textarea, button, summary")) {
      return true;
    }
    return live.querySelector("details[open]") !== null;
  }

  function tick() {
    if (document.hidden || busy()) { return; }
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { credentials: "same-origin", cache: "no-store", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.redirected || response.status === 401 || response.status === 403) {
          window.clearInterval(timer);
          say("Signed out: reload the page to log in again.");
          return null;
        }
        if (!response.ok) { say("Refresh failed (HTTP " + response.status + "); retrying."); return null; }
        return response.text();
      })
      .then(function (html) {
        if (html === null || html === undefined) { return; }
        live.innerHTML = html;
        say("Updated " + new Date().toLocaleTimeString());
      })
      .catch(function () { say("Refresh failed (control plane unreachable?); retrying."); });
  }

  timer = window.setInterval(tick, every);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { tick(); } });
})();
