fn main() {
    println!("nitsum-router {}", nitsum_scheduler::VERSION);
}
