// When the login behind an open page has ended (logged out in another tab, token revoked or
// expired), every callback is refused with 401. Dash's renderer only logs that, so the page went
// on showing its last data, contradicting a filter just changed, and refresh loops froze
// silently. Send the browser to the login form instead, coming back to this page afterwards.
(function () {
    "use strict";
    var fetchOriginal = window.fetch;
    var leaving = false;
    window.fetch = function (input) {
        var url = typeof input === "string" ? input : (input && input.url) || "";
        return fetchOriginal.apply(this, arguments).then(function (response) {
            if (response.status === 401 && !leaving && url.indexOf("/_dash-update-component") !== -1) {
                leaving = true;
                var here = window.location.pathname + window.location.search;
                window.location.assign("/login?next=" + encodeURIComponent(here));
            }
            return response;
        });
    };
})();
