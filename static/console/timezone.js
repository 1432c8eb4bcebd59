// Tell the console which time zone this browser is in, so that its pages show local times
// (console/project/pages.py reads the cookie). One reload the first time, none after.
(function () {
  var zone;
  try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone; } catch (e) { return; }
  if (!zone) return;
  var name = "loopguard_tz=";
  var current = document.cookie.split("; ").filter(function (c) { return c.indexOf(name) === 0; })[0];
  // IANA names are letters, digits and "/_+-": nothing a cookie value must escape.
  if (!/^[A-Za-z0-9_+\/-]{1,64}$/.test(zone)) return;
  var value = zone;
  if (current === name + value) return;
  document.cookie = name + value + "; path=/; max-age=31536000; SameSite=Lax";
  if (!current && document.body && document.body.dataset.timeZone !== zone) location.reload();
})();
