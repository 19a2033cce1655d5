// This browser's key to the models it added (attnviz.checkpoints.keep), renewed on every visit so that the cookie lasts
// as long as the kept models. SameSite=Strict: never sent with requests from other sites; Secure over HTTPS.
// window.attnvizCookie ({name, key, maxAge}) is set by attnviz.ui.page_scripts just before this script.
(function (cookie) {
  document.cookie = cookie.name + "=" + cookie.key + "; Max-Age=" + cookie.maxAge + "; Path=/; SameSite=Strict"
    + (location.protocol === "https:" ? "; Secure" : "");
})(window.attnvizCookie);
