// The console's pages against the basics of accessibility, in the browser,
// on what it rendered (tests/e2e/console/mod.rs). Returns a list of problems.
const problems = [];
if (!document.documentElement.lang) problems.push('<html> has no lang');
const headings = [...document.querySelectorAll('h1, h2, h3, h4, h5, h6')];
if (document.querySelectorAll('h1').length !== 1) problems.push('not exactly one <h1>');
let level = 0;
for (const h of headings) {
  const l = Number(h.tagName[1]);
  if (l > level + 1) problems.push(`heading ${h.tagName} "${h.textContent}" skips a level`);
  level = l;
}
for (const field of document.querySelectorAll('input:not([type=hidden]), select, textarea')) {
  if (!field.labels || field.labels.length === 0) problems.push(`field ${field.name} has no label`);
}
for (const b of document.querySelectorAll('button, a')) {
  if (!b.textContent.trim()) problems.push(`${b.tagName} without a name`);
}
const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
const lum = ([r, g, b]) => {
  const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
};
const background = (el) => {
  for (let e = el; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || (c.length === 4 && c[3] > 0)) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
const all = document.body.querySelectorAll('*');
for (const el of all) {
  const text = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
  if (!text || el.offsetParent === null) continue;
  const fg = lum(rgb(getComputedStyle(el).color).slice(0, 3));
  const bg = lum(background(el));
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  if (ratio < 4.5) problems.push(`contrast ${ratio.toFixed(2)}:1 for "${el.textContent.trim().slice(0, 40)}"`);
}
return problems;
