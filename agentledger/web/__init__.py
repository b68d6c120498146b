"""Web concerns the API and the dashboards share: who is asking, the error envelope, API-versus-page
routing, browser security and login. Neither the API nor the dashboards own them."""
