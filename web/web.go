// Package web is fencegw's dashboard: server-rendered pages and their static
// assets, embedded in the binary.
package web

import (
	"embed"
	"html/template"
	"net/http"
)

//go:embed templates
var templates embed.FS

var pages = template.Must(template.ParseFS(templates, "templates/*.html"))

// Handler serves the dashboard under /ui/.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ui/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'self'")
		_ = pages.ExecuteTemplate(w, "index.html", nil)
	})
}
