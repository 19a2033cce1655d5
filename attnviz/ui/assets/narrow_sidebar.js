// In a narrow window (a laptop split screen, a 900-px browser) the open sidebar leaves the page a column too thin
// for its controls and figures. Streamlit closes it on its own only below 768 px; this closes it once per tab,
// when the tab opens narrower than NARROW px, and never again, so a user who opens it keeps it open.
// No markup in this file: Streamlit's sanitiser (DOMPurify) drops a script whose text looks like tags.
(function () {
  var NARROW = 1100;
  var DONE = 'attnviz-narrow-sidebar-closed';
  if (window.__attnvizNarrowSidebar) { return; }
  window.__attnvizNarrowSidebar = true;
  if (window.innerWidth >= NARROW || window.innerWidth <= 768) { return; }  // wide, or Streamlit's own rule
  try { if (window.sessionStorage.getItem(DONE)) { return; } } catch (e) { /* storage off: close each load */ }
  var tries = 0;
  var clicked = false;
  function close() {
    var sidebar = document.querySelector('[data-testid="stSidebar"]');
    var button = document.querySelector('[data-testid="stSidebarCollapseButton"] button');
    if (sidebar && sidebar.getAttribute('data-collapsed') === 'true') {
      // closed: remembered only once our click took (a click before the page is ready is lost), so that a sidebar
      // the user opens again stays open
      if (clicked) { try { window.sessionStorage.setItem(DONE, '1'); } catch (e) { /* nowhere to keep it */ } }
      return;
    }
    if (sidebar && button) { button.click(); clicked = true; }
    if (tries++ < 150) { window.setTimeout(close, 200); }  // up to 30 s: a busy server draws the sidebar late
  }
  close();
})();
