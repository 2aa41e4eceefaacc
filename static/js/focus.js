/* Moves focus to the element marked data-focus-on-load: the error summary after a failed
   submit, the success banner after a save. No inline script, so the CSP can forbid them. */
(function () {
  "use strict";
  var target = document.querySelector("[data-focus-on-load]");
  if (target) {
    target.focus();
  }
})();
