// Tables marked class="sortable": click a column header to sort by it
// (numbers as numbers, text as text); click again to reverse.
document.querySelectorAll("table.sortable th").forEach((th) => th.addEventListener("click", () => {
  const column = th.cellIndex;
  const body = th.closest("table").tBodies[0];
  const rows = Array.from(body.rows);
  const key = (row) => {
    const text = (row.cells[column]?.textContent ?? "").trim();
    const n = parseFloat(text.replace(/,/g, ""));
    return isNaN(n) ? text : n;
  };
  const up = th.dataset.sorted !== "up";
  rows.sort((a, b) => (key(a) > key(b) ? 1 : key(a) < key(b) ? -1 : 0) * (up ? 1 : -1));
  th.dataset.sorted = up ? "up" : "down";
  rows.forEach((row) => body.appendChild(row));
}));
