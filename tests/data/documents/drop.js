// Drop files on the web page's drop zone as a browser does when files are dragged in: a DragEvent whose
// DataTransfer holds the Files. arguments[0]: a list of [bytes as base64, name, media type], one per file
// (run with Selenium's execute_script).
const data = new DataTransfer();
for (const [base64, name, media] of arguments[0]) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  data.items.add(new File([bytes], name, {type: media}));
}
const drop = document.getElementById("drop");
for (const type of ["dragover", "drop"])
  drop.dispatchEvent(new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
