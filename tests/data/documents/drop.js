// Drop a file on the web page's drop zone as a browser does when a file is dragged in: a DragEvent whose
// DataTransfer holds the File. arguments[0]: the file's bytes as base64; arguments[1]: its name;
// arguments[2]: its media type (run with Selenium's execute_script).
const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0));
const data = new DataTransfer();
data.items.add(new File([bytes], arguments[1], {type: arguments[2]}));
const drop = document.getElementById("drop");
for (const type of ["dragover", "drop"])
  drop.dispatchEvent(new DragEvent(type, {dataTransfer: data, bubbles: true, cancelable: true}));
