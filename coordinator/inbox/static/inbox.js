// Live updates without a build step: every element with data-refresh="URL" has its content
// replaced by that URL's server-rendered (escaped) fragment every few seconds.
(function () {
  "use strict";
  var PERIOD_MS = 2000;

  function refresh(element) {
    var url = element.getAttribute("data-refresh");
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (response) {
        if (response.ok && !response.redirected) {
          return response.text().then(function (html) { element.innerHTML = html; });
        }
      })
      .catch(function () { /* the server restarts: try again next period */ })
      .finally(function () { setTimeout(function () { refresh(element); }, PERIOD_MS); });
  }

  // The model's answer as it streams (the task's tokens stream, docs/protocol.md): each
  // answer (step, iteration, purpose) replaces the one before; stream_restarted or a newer
  // attempt starts it over, and the entries of an attempt older than one seen of the same
  // answer (an old attempt still streaming) are dropped, so two attempts of one answer are
  // never joined (shared/tokens.py AnswerView does the same). Text is set with textContent.
  var TOKENS_MS = 300;

  function follow(element) {
    var url = element.getAttribute("data-tokens");
    var after = "0-0";
    var answer = null;
    var attempt = 0;
    var text = null;
    var highest = {};

    function head(label, className) {
      var span = document.createElement("span");
      span.className = className;
      span.textContent = label;
      return span;
    }

    function apply(entry) {
      var key = entry.step + "/" + entry.iteration + "/" + entry.purpose;
      var tried = Number(entry.attempt);
      if (Object.prototype.hasOwnProperty.call(highest, key) && tried < highest[key]) { return; }
      highest[key] = tried;
      var newer = key === answer && tried > attempt;
      if (key !== answer || entry.kind === "stream_restarted" || newer) {
        element.textContent = "";
        var label = entry.step + " · iteration " + entry.iteration;
        if (entry.purpose !== "act") { label += " · " + entry.purpose; }
        element.appendChild(head(label, "answer-head"));
        if (key === answer) {
          element.appendChild(head("answer restarted (attempt " + entry.attempt + ")", "restarted"));
        }
        text = document.createElement("span");
        text.className = "answer-text";
        element.appendChild(text);
        answer = key;
        attempt = tried;
      }
      if (entry.kind === "token") { text.textContent += entry.text; }
      if (entry.kind === "stream_done") { element.setAttribute("data-done", key); }
    }

    function poll() {
      fetch(url + "?after=" + encodeURIComponent(after),
            { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (data) {
          if (data === null) { return true; }
          data.entries.forEach(function (entry) { after = entry.id; apply(entry); });
          return !(data.ended && data.entries.length === 0);
        })
        .catch(function () { return true; })
        .then(function (again) { if (again) { setTimeout(poll, TOKENS_MS); } });
    }
    poll();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(function (element) {
      setTimeout(function () { refresh(element); }, PERIOD_MS);
    });
    document.querySelectorAll("[data-tokens]").forEach(follow);
  });
})();
