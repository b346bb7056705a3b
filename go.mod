module github.com/weightcache/weightcache

go 1.26.8
