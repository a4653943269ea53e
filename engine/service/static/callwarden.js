// callwarden's dashboard script: optional. Pages are complete without it; it refreshes the
// overview in place, and sends the job page's admin actions with the session's token.
"use strict";
(function () {
  var KEY = "callwarden-admin-token";

  function liveOverview() {
    var live = document.getElementById("live");
    if (!live) return;
    var busy = false;
    function refresh() {
      if (busy || document.hidden) return;
      busy = true;
      var w = encodeURIComponent(live.getAttribute("data-window") || "hour");
      fetch("/overview/live?window=" + w, {credentials: "same-origin",
                                           headers: {"Accept": "text/html"}})
        .then(function (r) { if (!r.ok) throw new Error(r.status); return r.text(); })
        .then(function (html) {
          var next = document.createElement("div");
          next.innerHTML = html;
          var fresh = next.querySelector("#live");
          if (fresh) { live.replaceWith(fresh); live = fresh; }
        })
        .catch(function () {
          var s = document.getElementById("stamp");
          if (s) s.textContent = "Refresh failed; retrying";
        })
        .finally(function () { busy = false; });
    }
    window.setInterval(refresh, 5000);
  }

  function admin() {
    // The page offers actions only when the service takes them and the call's state
    // allows them: no box with a job, or no buttons, means nothing to wire.
    var box = document.querySelector(".admin[data-job]");
    if (!box) return;
    var job = box.getAttribute("data-job");
    var form = document.getElementById("token-form");
    var input = document.getElementById("admin-token");
    var actions = box.querySelector(".actions");
    var status = document.getElementById("admin-status");
    if (!form || !input || !actions || !status) return;
    form.hidden = false;
    actions.hidden = false;
    function token() { return window.sessionStorage.getItem(KEY) || ""; }
    function show() {
      status.textContent = token() ? "Admin token set for this browser session."
                                   : "Enter the admin token to use the actions.";
    }
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      if (input.value) window.sessionStorage.setItem(KEY, input.value);
      input.value = "";
      show();
    });
    document.getElementById("forget-token").addEventListener("click", function () {
      window.sessionStorage.removeItem(KEY);
      show();
    });
    box.querySelectorAll("button[data-action]").forEach(function (button) {
      button.addEventListener("click", function () {
        var action = button.getAttribute("data-action");
        var headers = {};
        if (token()) headers["Authorization"] = "Bearer " + token();
        status.textContent = action + "...";
        fetch("/admin/jobs/" + encodeURIComponent(job) + "/" + action,
              {method: "POST", headers: headers, credentials: "omit"})
          .then(function (r) {
            return r.text().then(function (body) {
              status.textContent = action + ": HTTP " + r.status + " " + body;
              status.setAttribute("data-status", String(r.status));
              if (r.ok) window.setTimeout(function () { window.location.reload(); }, 800);
            });
          })
          .catch(function (e) { status.textContent = action + " failed: " + e; });
      });
    });
    show();
  }

  document.addEventListener("DOMContentLoaded", function () { liveOverview(); admin(); });
})();
