// The lines view, as in bertviz: hovering a query (or key) token draws its lines dark and dims the others. The
// figure's layout.meta lists the drawn lines (attnviz.viz.heads.attention_lines); nothing goes to the server.
(function () {
  if (window.__attnvizLinesHighlight) { return; }
  window.__attnvizLinesHighlight = true;
  function meta(plot) {
    var m = plot.layout && plot.layout.meta;
    return m && m.attnviz === 'lines' ? m : null;
  }
  function show(plot, side, row) {
    var m = meta(plot);
    if (!m) { return; }
    var xs = [], ys = [];
    m.lines.forEach(function (line) {
      if ((side === 'queries' && line[0] === row) || (side === 'keys' && line[1] === row)) {
        xs.push(0, 1, null);
        ys.push(line[0], line[1], null);
      }
    });
    window.Plotly.restyle(plot, {x: [xs], y: [ys]}, [m.highlight]);
    if (m.line_traces.length) { window.Plotly.restyle(plot, {opacity: 0.12}, m.line_traces); }
    plot.__attnvizHighlighted = true;
  }
  function clear(plot) {
    var m = meta(plot);
    if (!m || !plot.__attnvizHighlighted) { return; }
    plot.__attnvizHighlighted = false;
    window.Plotly.restyle(plot, {x: [[]], y: [[]]}, [m.highlight]);
    var opacities = m.line_traces.map(function (index) { return plot.__attnvizOpacity[index]; });
    if (m.line_traces.length) { window.Plotly.restyle(plot, {opacity: opacities}, m.line_traces); }
  }
  function bind(plot) {
    if (!meta(plot) || plot.__attnvizLinesBound || typeof plot.on !== 'function') { return; }
    plot.__attnvizLinesBound = true;
    plot.on('plotly_hover', function (event) {
      var point = event.points && event.points[0];
      if (!point || (point.data.name !== 'queries' && point.data.name !== 'keys')) { return; }
      if (!plot.__attnvizHighlighted) {  // the opacities to restore, read before any dimming
        plot.__attnvizOpacity = plot.data.map(function (trace) { return trace.opacity; });
      }
      show(plot, point.data.name, point.pointIndex);
    });
    plot.on('plotly_unhover', function () { clear(plot); });
  }
  function bindAll() { document.querySelectorAll('.js-plotly-plot').forEach(bind); }
  new MutationObserver(bindAll).observe(document.body, {childList: true, subtree: true});
  bindAll();
})();
