// Building the page's elements. Text is always set as text, never parsed as HTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value == null || value === false) continue;
    if (name === "class") el.className = value;
    else if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

export function empty(title, ...hint) {
  return h("div", { class: "empty" }, h("p", { class: "empty-title" }, title),
    hint.length ? h("p", { class: "muted" }, ...hint) : null);
}

export function table(columns, className = "") {
  const tbody = h("tbody");
  const el = h("table", { class: className },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.title)))),
    tbody);
  return { el, tbody };
}

// Updates tbody's rows in place, keyed by key(item): a row that stays keeps its element
// (a click on it is not lost to a refresh), new ones are created, gone ones removed.
export function keyedRows(tbody, items, key, create, update) {
  const old = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
  const rows = items.map((item) => {
    const k = String(key(item));
    let tr = old.get(k);
    if (!tr) {
      tr = create(item);
      tr.dataset.key = k;
    }
    old.delete(k);
    update(tr, item);
    return tr;
  });
  for (const tr of old.values()) tr.remove();
  rows.forEach((tr, i) => {
    if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
  });
}
