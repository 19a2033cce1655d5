// Adds a "Download as SVG" button to every Plotly toolbar, in the browser: Plotly draws SVG itself, so nothing
// is installed or sent to a server. Streamlit's bundled plotly.js is window.Plotly once a chart has loaded.
// No markup in this file: Streamlit's sanitiser (DOMPurify) drops a script whose text looks like tags.
(function () {
  if (window.__attnvizSvgDownloads) { return; }
  window.__attnvizSvgDownloads = true;
  var SVG_NS = 'http://www.w3.org/2000/svg';
  function icon() {  // a down arrow over the letters SVG, drawn with DOM calls (no markup in this script)
    var svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('viewBox', '0 0 24 24');
    svg.setAttribute('width', '16');
    svg.setAttribute('height', '16');
    svg.setAttribute('class', 'icon');
    var arrow = document.createElementNS(SVG_NS, 'path');
    arrow.setAttribute('d', 'M11 2h2v9l3-3 1.4 1.4L12 14.8 6.6 9.4 8 8l3 3z');
    arrow.setAttribute('fill', 'currentColor');
    var label = document.createElementNS(SVG_NS, 'text');
    label.setAttribute('x', '12');
    label.setAttribute('y', '23');
    label.setAttribute('font-size', '8');
    label.setAttribute('text-anchor', 'middle');
    label.setAttribute('fill', 'currentColor');
    label.textContent = 'SVG';
    svg.appendChild(arrow);
    svg.appendChild(label);
    return svg;
  }
  function addButton(plot) {
    var bar = plot.querySelector('.modebar');
    if (!bar || bar.querySelector('[data-attnviz-svg]')) { return; }
    var group = document.createElement('div');
    group.className = 'modebar-group';
    var button = document.createElement('a');
    button.className = 'modebar-btn';
    button.setAttribute('rel', 'tooltip');
    button.setAttribute('data-title', 'Download as SVG');
    button.setAttribute('aria-label', 'Download as SVG');
    button.setAttribute('data-attnviz-svg', '1');
    button.appendChild(icon());
    button.addEventListener('click', function () {
      var options = (plot._context && plot._context.toImageButtonOptions) || {};
      var layout = plot._fullLayout || {};
      window.Plotly.downloadImage(plot, {format: 'svg', filename: options.filename || 'attnviz-figure',
                                         width: layout.width, height: layout.height});
    });
    group.appendChild(button);
    bar.insertBefore(group, bar.firstChild);
  }
  function addButtons() { document.querySelectorAll('.js-plotly-plot').forEach(addButton); }
  new MutationObserver(addButtons).observe(document.body, {childList: true, subtree: true});
  addButtons();
})();
