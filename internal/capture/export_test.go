package capture

// SetBeforeWrite lets external tests stall a writer before each write.
func SetBeforeWrite(o *Options, f func()) { o.beforeWrite = f }
