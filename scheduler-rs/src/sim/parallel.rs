//! The simulator's one thread pool: the forecast's predictions and the shadow runs spread
//! over the machine's cores with it.

/// `f` on every item on up to `available_parallelism` threads, each taking the next item
/// when it is free (items differ in cost: an overloaded FCFS shadow holds a long queue).
pub(super) fn for_each_parallel<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        items.iter_mut().for_each(f);
        return;
    }
    let next = std::sync::Mutex::new(items.iter_mut());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let item = next.lock().expect("no thread panics holding it").next();
                match item {
                    Some(item) => f(item),
                    None => break,
                }
            });
        }
    });
}

/// `f` over `items` in parallel ([`for_each_parallel`]), results in `items` order.
pub(super) fn parallel_map<T: Sync, R: Send + Default>(
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let mut slots: Vec<(&T, R)> = items.iter().map(|x| (x, R::default())).collect();
    for_each_parallel(&mut slots, |(x, r)| *r = f(x));
    slots.into_iter().map(|(_, r)| r).collect()
}
