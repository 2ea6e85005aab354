"""Write assets/train_prompts.txt: the chat prompts a draft head for the built-in target is trained on
(`python -m specviz train-draft --prompts train`). Half are user messages the target wrote itself
(assets/self_prompts.txt, from scripts/make_self_prompts.py), alternating with task templates filled with
a topic, drawn without repetition from their product with a fixed seed, so the file is reproducible:

    python scripts/make_train_prompts.py [--count 4000] [--seed 0]

None of them is a benchmark or example prompt, and no topic of the chat prompts the head is measured
on (scripts/bench_head.py) appears in them: the shipped head's figures are on prompts it never saw."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.catalog import TRAIN_PROMPTS_FILE, load_examples, preset_prompt_sets  # noqa: E402

TEMPLATES = [
    "Explain {t} to a beginner.",
    "Explain {t} in simple terms.",
    "What is {t}? Answer in a short paragraph.",
    "What are three interesting facts about {t}?",
    "What are the pros and cons of {t}?",
    "Give me five tips about {t}.",
    "Write a short paragraph about {t} for a school newsletter.",
    "Write a haiku about {t}.",
    "Write a short poem about {t}.",
    "Write a short story in which {t} plays a role.",
    "Describe {t} to someone who has never heard of it.",
    "How would you teach {t} to a group of adults?",
    "What questions might a student ask about {t}? List four.",
    "Summarize the history of {t} in a few sentences.",
    "Why do people care about {t}?",
    "What are common misconceptions about {t}?",
    "Write a friendly email inviting a colleague to a talk about {t}.",
    "Give a step-by-step guide to getting started with {t}.",
    "Compare {t} with something similar and explain the differences.",
    "What would a world without {t} look like?",
    "List the key terms someone should know about {t}, with a one-line definition each.",
    "Write a short dialogue between two friends discussing {t}.",
    "What are the biggest challenges related to {t} today?",
    "How has {t} changed over the last hundred years?",
    "Write a product description for a book about {t}.",
    "Give an example of how {t} affects everyday life.",
    "What careers are connected to {t}?",
    "Create a short quiz with three questions about {t}, and give the answers.",
    "Write a limerick about {t}.",
    "What is the most important thing to understand about {t}?",
    "Write a short speech about {t} for a community meeting.",
    "Tell me a fun story for children about {t}.",
    "What are the main arguments for and against {t}?",
    "Explain why {t} matters, in three sentences.",
    "Write a tweet-length summary of {t}.",
    "How can a small town benefit from {t}?",
    "Describe a typical day for someone who works with {t}.",
    "What mistakes do beginners make with {t}?",
    "Outline a one-hour lesson plan about {t}.",
    "What does the future of {t} look like?",
    "I want to learn about {t}. Where should I start?",
    "Can you help me understand {t}? I keep getting confused.",
    "My friend says {t} is overrated. What would you tell them?",
    "I'm writing a school report on {t}. What should I include?",
    "What are some good questions to ask an expert on {t}?",
    "How would you explain {t} to a five-year-old?",
    "Give me a quick overview of {t} in plain language.",
    "What are the first three things a newcomer should know about {t}?",
    "I only have ten minutes. Tell me the essentials of {t}.",
    "What is a common problem people run into with {t}, and how do they fix it?",
    "Suggest a weekend project related to {t}.",
    "What books or resources would you recommend for {t}? Describe what to look for.",
    "How do experts and beginners think differently about {t}?",
    "What would you say to someone who is nervous about {t}?",
    "Write a short encouraging message to a friend who is getting into {t}.",
    "What are the do's and don'ts of {t}?",
    "Is {t} worth the effort? Give a balanced answer.",
    "How can I talk about {t} at a dinner party without boring anyone?",
    "Draft a short blog post introduction about {t}.",
    "What is one surprising thing most people don't know about {t}?",
    "Explain the basics of {t} in a numbered list.",
    "How does {t} work, step by step?",
    "What are the costs and benefits of {t} for a family?",
    "Write a short FAQ about {t} with three questions and answers.",
    "How would you plan a small club meeting about {t}?",
    "My teenager is curious about {t}. How can I encourage them?",
    "Give me a simple analogy that explains {t}.",
    "What mistakes should I avoid when I first try {t}?",
    "Summarize the main ideas behind {t} for a busy person.",
]

TOPICS = """
photosynthesis; volcanoes; earthquakes; the water cycle; black holes; the solar system; the moon landing;
electricity; magnets; gravity; the periodic table; DNA; vaccines; the immune system; bacteria; climate change;
renewable energy; solar panels; wind turbines; nuclear power; recycling; composting; ocean tides; coral reefs;
rainforests; deserts; glaciers; hurricanes; tornadoes; rainbows; the northern lights; dinosaurs; fossils;
evolution; bees; ants; penguins; elephants; whales; octopuses; wolves; owls; butterflies; migrating birds;
honey; coffee; tea; chocolate; bread baking; sourdough; pizza; sushi; pasta; spices; vegetarian cooking;
meal planning; food waste; fermentation; gardening; growing tomatoes; bonsai trees; bird watching; hiking;
camping; cycling; running a marathon; swimming; yoga; meditation; chess; board games; video games; puzzles;
knitting; woodworking; pottery; painting with watercolors; photography; origami; calligraphy; learning guitar;
the piano; jazz music; classical music; hip hop; film making; theater; poetry; novels; libraries; museums;
the printing press; the Roman Empire; ancient Egypt; the pyramids; the Great Wall of China; the Silk Road;
the Renaissance; the Industrial Revolution; the French Revolution; the Vikings; the Olympic Games; castles;
knights; pirates; explorers; maps; compasses; lighthouses; trains; airplanes; electric cars; bicycles;
public transport; city planning; bridges; skyscrapers; tunnels; the internet; email; smartphones;
social media; online privacy; passwords; computer viruses; machine learning; robots; 3D printing;
programming; spreadsheets; databases; open source software; cloud computing; video calls; remote work;
time management; public speaking; writing a resume; negotiating a salary; starting a small business;
budgeting; saving money; investing; credit cards; taxes; insurance; renting an apartment; moving to a new city;
learning a new language; studying for exams; note taking; reading habits; homeschooling; online courses;
volunteering; recycling at home; minimalism; decluttering; cleaning the kitchen; doing laundry; home repairs;
painting a room; saving energy at home; pets; training a puppy; cats; aquariums; horses; first aid;
staying hydrated; healthy breakfasts; stretching; posture; walking every day; friendship; teamwork;
leadership; kindness; gratitude; patience; curiosity; creativity; motivation; habits; journaling;
birthday parties; weddings; holidays; the new year; family traditions; grandparents; twins; neighbors;
weather forecasts; clouds; snow; thunderstorms; the seasons; sunsets; stars; telescopes; astronauts;
the International Space Station; Mars; Jupiter; comets; satellites; GPS; clocks; calendars; money;
banks; markets; supply and demand; inflation; trade; farming; tractors; cows; chickens; apples; rice;
wheat; cotton; wool; silk; paper; glass; plastic; steel; concrete; wood; rivers; lakes; mountains; islands;
caves; waterfalls; forests; national parks; zoos; aquariums for the public; circuses; amusement parks;
football; basketball; tennis; cricket; skiing; surfing; rock climbing; sailing; fishing; kites;
paper airplanes; magic tricks; riddles; jokes; superheroes; fairy tales; myths; dragons; unicorns;
robots in movies; time travel; detective stories; science fiction; comic books; cartoons; animation;
television; radio; podcasts; newspapers; advertising; fashion; shoes; hats; uniforms; architecture;
gardens in cities; street food; farmers markets; coffee shops; restaurants; tipping; cooking with kids;
school lunches; recess; homework; teachers; nurses; firefighters; doctors; engineers; scientists;
librarians; pilots; chefs; farmers; artists; musicians; athletes; inventors; the telephone; the light bulb;
the wheel; fire; writing systems; numbers; zero; geometry; fractions; probability; statistics; algebra;
prime numbers; infinity; patterns in nature; symmetry; colors; light; sound; music and math; echoes;
recycling electronics; batteries; water purification; clean air; noise pollution; traffic; carpooling;
""".replace("\n", " ")

# Topics of the chat prompts the shipped head is measured on: kept out of its training prompts.
HELD_OUT_WORDS = ("sleep", "sky", "paris", "interview", "accountant", "house plant", "plants")


def topics() -> list[str]:
    found = list(dict.fromkeys(t.strip() for t in TOPICS.split(";") if t.strip()))
    return [t for t in found if not any(word in t.lower() for word in HELD_OUT_WORDS)]


def template_prompts(seed: int = 0) -> list[str]:
    """Every template filled with every topic, none a benchmark or example prompt, shuffled with `seed`."""
    measured = {p.prompt for prompts in preset_prompt_sets().values() for p in prompts}
    measured |= {e["prompt"] for e in load_examples()}
    product = [template.format(t=topic) for template in TEMPLATES for topic in topics()]
    product = [p for p in product if p not in measured]
    random.Random(seed).shuffle(product)
    return product


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(TRAIN_PROMPTS_FILE))
    parser.add_argument("--self-prompts", default=str(ROOT / "assets" / "self_prompts.txt"),
                        help="user messages the target wrote (scripts/make_self_prompts.py): when the file "
                             "exists, they are the first half of the count, alternating with template prompts")
    args = parser.parse_args()
    product = template_prompts(args.seed)
    own = Path(args.self_prompts)
    written = [p for p in own.read_text(encoding="utf-8").splitlines() if p.strip()] if own.is_file() else []
    written = written[:args.count // 2]
    templated = product[:args.count - len(written)]
    # Alternating, so that any prefix of the file (train-draft stops at its token budget) has both kinds.
    chosen = [p for pair in zip(written, templated) for p in pair] + templated[len(written):]
    Path(args.out).write_text("\n".join(chosen) + "\n", encoding="utf-8")
    print(f"{len(chosen)} prompts: {len(written)} the target wrote ({own.name}), {len(templated)} from "
          f"{len(TEMPLATES)} templates x {len(topics())} topics = {len(product)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
