/* The campaign form's time-zone picker: type part of a zone, a city or a country and
   choose from the matches (the ARIA 1.2 combobox pattern: arrows move, Enter or a click
   chooses, Escape closes). Without this script the input keeps its <datalist>, which the
   browser offers by itself; either way the server accepts only the zones listed.
   No inline script, so the CSP can forbid them. */
(function () {
  "use strict";
  var source = document.getElementById("timezone-zones");
  if (!source || !document.createElement("ul").classList) {
    return;
  }
  var LIMIT = 8;
  var zones = Array.prototype.map.call(source.options, function (option) {
    return {
      value: option.value,
      label: option.label,
      text: (option.value + " " + option.label).replace(/[_/]/g, " ").toLowerCase()
    };
  });
  // Every zone field of the page (the campaign's zone, the fallback zone) shares the list.
  Array.prototype.forEach.call(
    document.querySelectorAll('input[list="timezone-zones"]'),
    function (input) { picker(input, zones, LIMIT); }
  );

  function picker(input, zones, LIMIT) {
    var listbox = document.createElement("ul");
    listbox.id = input.id + "-listbox";
    listbox.className = "zone-listbox";
    listbox.setAttribute("role", "listbox");
    listbox.setAttribute("aria-label", "Matching time zones");
    listbox.hidden = true;
    var status = document.createElement("p");
    status.className = "visually-hidden";
    status.setAttribute("role", "status");
    input.parentNode.insertBefore(listbox, input.nextSibling);
    listbox.parentNode.insertBefore(status, listbox.nextSibling);

    input.removeAttribute("list"); // one list of suggestions, not two
    input.setAttribute("role", "combobox");
    input.setAttribute("aria-autocomplete", "list");
    input.setAttribute("aria-expanded", "false");
    input.setAttribute("aria-controls", listbox.id);

    var shown = [];
    var active = -1;

    function matches(query) {
      var words = query.replace(/[_/]/g, " ").toLowerCase().split(/\s+/).filter(Boolean);
      if (!words.length) { return []; }
      var found = zones.filter(function (zone) {
        return words.every(function (word) { return zone.text.indexOf(word) !== -1; });
      });
      // Zones whose name starts with what was typed first ("Paris" before "Paramaribo"'s
      // country), then the rest in the list's order.
      var first = words.join(" ");
      var starts = function (zone) {
        var name = zone.value.replace(/_/g, " ").toLowerCase();
        var city = name.slice(name.lastIndexOf("/") + 1);
        return city.indexOf(first) === 0 || name.indexOf(first) === 0 ? 0 : 1;
      };
      return found
        .map(function (zone, index) { return [starts(zone), index, zone]; })
        .sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; })
        .map(function (entry) { return entry[2]; });
    }

    function setActive(index) {
      active = index;
      Array.prototype.forEach.call(listbox.children, function (item, i) {
        item.setAttribute("aria-selected", i === index ? "true" : "false");
      });
      if (index >= 0 && listbox.children[index]) {
        input.setAttribute("aria-activedescendant", listbox.children[index].id);
        listbox.children[index].scrollIntoView({ block: "nearest" });
      } else {
        input.removeAttribute("aria-activedescendant");
      }
    }

    function close() {
      listbox.hidden = true;
      input.setAttribute("aria-expanded", "false");
      setActive(-1);
    }

    function choose(index) {
      if (shown[index]) {
        input.value = shown[index].value;
        status.textContent = shown[index].value + " chosen.";
      }
      close();
    }

    function update() {
      var found = matches(input.value);
      var exact = found.length === 1 && found[0].value === input.value;
      shown = found.slice(0, LIMIT);
      listbox.textContent = "";
      shown.forEach(function (zone, index) {
        var item = document.createElement("li");
        item.id = input.id + "-option-" + index;
        item.className = "zone-listbox__option";
        item.setAttribute("role", "option");
        item.setAttribute("aria-selected", "false");
        var name = document.createElement("span");
        name.className = "zone-listbox__name";
        name.textContent = zone.value;
        var place = document.createElement("span");
        place.className = "zone-listbox__place";
        place.textContent = zone.label;
        item.appendChild(name);
        item.appendChild(document.createTextNode(" "));
        item.appendChild(place);
        item.addEventListener("mousedown", function (event) {
          event.preventDefault(); // keep focus in the input
          choose(index);
        });
        listbox.appendChild(item);
      });
      if (!shown.length || exact) {
        close();
        status.textContent = input.value.trim() && !shown.length ? "No zone matches." : "";
        return;
      }
      listbox.hidden = false;
      input.setAttribute("aria-expanded", "true");
      setActive(-1);
      status.textContent = found.length > LIMIT
        ? found.length + " zones match; the first " + LIMIT + " are listed."
        : found.length + (found.length === 1 ? " zone matches." : " zones match.");
    }

    input.addEventListener("input", update);
    input.addEventListener("keydown", function (event) {
      var open = !listbox.hidden;
      if (event.key === "ArrowDown") {
        event.preventDefault();
        if (!open) { update(); }
        if (shown.length) { setActive(Math.min(active + 1, shown.length - 1)); }
      } else if (event.key === "ArrowUp" && open) {
        event.preventDefault();
        setActive(Math.max(active - 1, 0));
      } else if (event.key === "Enter" && open && active >= 0) {
        event.preventDefault(); // choosing is not submitting
        choose(active);
      } else if (event.key === "Escape" && open) {
        event.preventDefault();
        close();
      }
    });
    input.addEventListener("blur", close);
  }
})();
