// callwarden's dashboard script: optional. Pages are complete without it; it refreshes the
// overview in place, and sends the job page's admin actions and the call list's bulk
// actions with the session's token.
"use strict";
(function () {
  var KEY = "callwarden-admin-token";

  function token() { return window.sessionStorage.getItem(KEY) || ""; }

  function tokenForm(status) {
    // The admin token's form (job page, call list): kept in this tab's sessionStorage,
    // sent as "Authorization: Bearer"; never a cookie.
    var form = document.getElementById("token-form");
    var input = document.getElementById("admin-token");
    var forget = document.getElementById("forget-token");
    if (!form || !input || !forget) return;
    form.hidden = false;
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
    forget.addEventListener("click", function () {
      window.sessionStorage.removeItem(KEY);
      show();
    });
    show();
  }

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
    var actions = box.querySelector(".actions");
    var status = document.getElementById("admin-status");
    if (!actions || !status) return;
    actions.hidden = false;
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
    tokenForm(status);
  }

  function bulk() {
    // The call list's bulk actions: a selection of rows, or every call matching the
    // filter; each click asks the server for a preview (how many calls, how many
    // credits), shown in a dialog, and only its "Confirm" runs what was previewed.
    var box = document.getElementById("bulk");
    var status = document.getElementById("bulk-status");
    var count = document.getElementById("bulk-count");
    var all = document.getElementById("pick-all");
    var dialog = document.getElementById("bulk-confirm");
    var question = document.getElementById("bulk-question");
    var go = document.getElementById("bulk-go");
    var cancel = document.getElementById("bulk-cancel");
    var title = document.getElementById("bulk-title");
    if (!box || !status || !count || !all || !dialog || !question || !go || !cancel ||
        !title) return;
    var pageBox = document.getElementById("pick-page");
    var rows = Array.prototype.slice.call(document.querySelectorAll("input.pick-row"));
    var buttons = Array.prototype.slice.call(box.querySelectorAll("button[data-bulk]"));
    var filter = {};
    new URLSearchParams(box.getAttribute("data-filter") || "").forEach(function (v, k) {
      filter[k] = v;
    });
    var offered = {};  // every call matching the filter: the actions a preview found calls for
    var plan = null;   // the preview the dialog asks to confirm: {action, jobs}
    box.hidden = false;
    document.querySelectorAll(".pick").forEach(function (cell) { cell.hidden = false; });
    tokenForm(status);

    function picked() { return rows.filter(function (r) { return r.checked; }); }
    function legal(action) {
      if (all.checked) return offered[action] === true;
      return picked().some(function (r) {
        return (r.getAttribute("data-actions") || "").split(" ").indexOf(action) >= 0;
      });
    }
    function refresh() {
      var n = picked().length;
      count.textContent = all.checked ? "Every call matching the filter"
        : n ? n + " selected" : "No call selected";
      buttons.forEach(function (b) { b.hidden = !legal(b.getAttribute("data-bulk")); });
      if (pageBox && !all.checked) pageBox.checked = rows.length > 0 && n === rows.length;
    }
    function post(action, body) {
      var headers = {"Content-Type": "application/json"};
      if (token()) headers["Authorization"] = "Bearer " + token();
      return fetch("/admin/bulk/" + encodeURIComponent(action),
                   {method: "POST", headers: headers, credentials: "omit",
                    body: JSON.stringify(body)})
        .then(function (r) {
          status.setAttribute("data-status", String(r.status));
          if (r.ok) return r.json();
          return r.text().then(function (t) { throw new Error("HTTP " + r.status + " " + t); });
        });
    }
    function checkFilter() {
      offered = {};
      status.textContent = "Counting the calls matching the filter...";
      Promise.all(buttons.map(function (b) {
        var action = b.getAttribute("data-bulk");
        return post(action, {filter: filter}).then(function (p) {
          offered[action] = p.calls > 0;
          return b.textContent + ": " + p.calls;
        });
      })).then(function (counts) {
        status.textContent = "Matching the filter: " + counts.join("; ") + ".";
      }).catch(function (e) { status.textContent = e.message; })
        .finally(refresh);
    }

    rows.forEach(function (r) { r.addEventListener("change", refresh); });
    if (pageBox) pageBox.addEventListener("change", function () {
      rows.forEach(function (r) { r.checked = pageBox.checked; });
      refresh();
    });
    all.addEventListener("change", function () {
      rows.forEach(function (r) { r.checked = all.checked; r.disabled = all.checked; });
      if (pageBox) { pageBox.checked = all.checked; pageBox.disabled = all.checked; }
      if (all.checked) checkFilter(); else status.textContent = "";
      refresh();
    });
    buttons.forEach(function (b) {
      b.addEventListener("click", function () {
        var action = b.getAttribute("data-bulk");
        var body = all.checked ? {filter: filter}
          : {job_ids: picked().map(function (r) { return r.value; })};
        status.textContent = "Counting...";
        post(action, body).then(function (p) {
          plan = p.calls > 0 ? {action: action, jobs: p.jobs} : null;
          title.textContent = "Confirm: " + b.textContent;
          question.textContent = p.summary;
          go.textContent = b.textContent + ": " + p.calls + (p.calls === 1 ? " call" : " calls");
          go.className = action === "force-fail" ? "danger" : "";
          go.hidden = plan === null;
          status.textContent = "";
          dialog.showModal();
        }).catch(function (e) { status.textContent = action + ": " + e.message; });
      });
    });
    dialog.addEventListener("cancel", function () { plan = null; });  // Esc
    cancel.addEventListener("click", function () {
      plan = null;
      dialog.close();
      status.textContent = "Cancelled: nothing was changed.";
    });
    go.addEventListener("click", function () {
      var p = plan;
      plan = null;
      dialog.close();
      if (!p) return;
      status.textContent = p.action + "...";
      post(p.action, {confirm: p.jobs}).then(function (r) {
        var skips = r.skips.map(function (s) { return s.id + ": " + s.reason; });
        status.textContent = p.action + ": " + r.applied + " applied, " + r.skipped +
          " skipped, " + r.credits_refunded + " credits refunded." +
          (skips.length ? " Skipped: " + skips.join("; ") : "");
        status.setAttribute("data-done", String(r.applied));
        if (!skips.length) window.setTimeout(function () { window.location.reload(); }, 800);
      }).catch(function (e) { status.textContent = p.action + ": " + e.message; });
    });
    refresh();
  }

  document.addEventListener("DOMContentLoaded", function () {
    liveOverview(); admin(); bulk();
  });
})();
