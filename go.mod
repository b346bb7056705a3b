module github.com/weightcache/weightcache

go 1.26.8

require (
	go.yaml.in/yaml/v3 v3.0.6
	golang.org/x/sys v0.50.0
)
