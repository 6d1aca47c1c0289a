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

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh]").forEach(function (element) {
      setTimeout(function () { refresh(element); }, PERIOD_MS);
    });
  });
})();
