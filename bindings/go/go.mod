module github.com/tether-ml/tether/bindings/go

go 1.19
