// A live list does not refresh under a person's hand: while a task is ticked for a bulk
// action, the task list's own poll is skipped (filtering, from the form above, still works).
document.addEventListener("htmx:beforeRequest", function (event) {
  var region = event.detail && event.detail.elt;
  if (region && region.id === "results" && region.querySelector('input[name="task"]:checked')) {
    event.preventDefault();
  }
});
